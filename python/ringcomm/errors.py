"""Errors raised by ringcomm (defined by the native core, re-exported here).

RingcommError (a RuntimeError): a collective failed (mismatched calls across
ranks, a peer that aborted, a communicator used after an error).
TimeoutError (a RingcommError): a blocking wait passed its deadline.
CollectiveMismatchError (a RingcommError): ranks called different collectives
(op, dtype, count, root) or split with different lists; raised on every rank.
RevokedError (a RingcommError): the communicator was revoked (revoke() on any
rank); agree() and shrink() still work on it.
Bad arguments raise the builtin ValueError / TypeError before anything is sent.
"""
from ringcomm._C import CollectiveMismatchError, RevokedError, RingcommError, TimeoutError  # noqa: A004

__all__ = ["CollectiveMismatchError", "RevokedError", "RingcommError", "TimeoutError"]

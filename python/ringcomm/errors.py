"""Errors raised by ringcomm (defined by the native core, re-exported here).

RingcommError (a RuntimeError): a collective failed (mismatched calls across
ranks, a peer that aborted, a communicator used after an error).
TimeoutError (a RingcommError): a blocking wait passed its deadline.
Bad arguments raise the builtin ValueError / TypeError before anything is sent.
"""
from ringcomm._C import RingcommError, TimeoutError  # noqa: A004  (shadows the builtin on purpose)

__all__ = ["RingcommError", "TimeoutError"]

"""Fault recovery: agreement among the live ranks and shrinking a communicator.

A revoked or failed communicator cannot carry data any more, so both run
through the rendezvous store, which must outlive the lost ranks (torchrun's
agent serves it, or a launcher process; under plain MASTER_ADDR / MASTER_PORT
rank 0 serves it, and the loss of rank 0 ends the job).

Agreement (as ULFM's MPIX_Comm_agree): every live member writes its vote under
its own key with compare_set(key, "", vote); a member that waits for another
one's vote and holds evidence that it is gone (its process died, it closed
its communicator, its connection broke: Transport::peer_gone; a local pid
that no longer runs) writes "dead" into that key the same way. compare_set
lets only the first writer win, so each key ends holding a vote or "dead",
never both, and every survivor reads the same final values: the same answer
on every rank, also when a rank dies while the agreement runs (it either
voted first, or is found dead). A rank that is only slow (stopped, swapped
out) has no such evidence against it and is waited for, up to the timeout;
at the timeout the ranks still missing are declared dead. A rank declared
dead that votes later finds "dead" in its key and raises: it is no longer a
member.

Shrinking (as MPIX_Comm_shrink / ncclCommShrink): the survivors revoke the
parent (calls still in flight on it raise RevokedError), agree on who is
gone, build a communicator of the rest under a prefix of its own (nothing
stale is read), and confirm it with a second agreement on the new members: if
one died while it was being built, every survivor sees that, and they all
build again without it.
"""
import json
import time

from ringcomm import bootstrap
from ringcomm.errors import CollectiveMismatchError, RingcommError, TimeoutError  # noqa: A004

_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.02
_DEAD = "dead"


def _text(value):
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


def _compare_set(store, key, value, what):
    compare_set = getattr(store, "compare_set", None)
    if compare_set is None:
        raise RingcommError(f"ringcomm: {what} needs a store with compare_set (torch's TCPStore, FileStore and "
                            f"HashStore have it; {type(store).__name__} has not)")
    try:
        return _text(compare_set(key, "", value))
    except Exception as e:  # noqa: BLE001 - the store's own error types
        raise bootstrap.store_failed(what, store, e) from e


def _peek(store, key, what):
    try:
        if not store.check([key]):
            return None
        return _text(store.get(key))
    except Exception as e:  # noqa: BLE001
        raise bootstrap.store_failed(what, store, e) from e


class Liveness:
    """Evidence that a member is gone: the communicator's own links (a dead
    process, a closed communicator, a broken connection), the pids of members
    on this host, and the ranks earlier agreements found dead."""

    def __init__(self, native, census, rank, known_dead=frozenset()):
        self._native = native
        self._known = known_dead  # read live: the caller adds what later agreements find
        mine = census[rank] if census else None
        self._pids = {}
        if mine and mine.get("pidns"):
            for r, info in enumerate(census):
                if r != rank and info.get("host") == mine["host"] and info.get("pidns") == mine["pidns"]:
                    self._pids[r] = info["pid"]

    def gone(self, r):
        """Why member r is known to be gone, or ""."""
        if r in self._known:
            return f"rank {r} was found gone by an earlier agreement"
        if self._native is not None:
            try:
                why = self._native.peer_gone(r)
            except Exception:  # noqa: BLE001 - a released native communicator knows nothing
                why = ""
            if why:
                return why
        pid = self._pids.get(r)
        if pid is not None and bootstrap.process_gone(pid):
            return f"rank {r} (pid {pid}) died"
        return ""


def flag_vote(text):
    """An agree() vote: a flag 0 .. 2**63 - 1 (ValueError otherwise)."""
    if not text.isdigit() or len(text) > 19 or int(text) >= 1 << 63:
        raise ValueError("not a flag")
    return int(text)


def agree(store, prefix, rank, members, vote, liveness, timeout_s, what="agree", parse=str):
    """Fault-tolerant agreement of `members` (ranks, this one among them) on
    their `vote`s (short strings). Returns ({rank: parse(vote)} of the members
    that voted, {rank: why} of those found dead), the same on every survivor;
    a vote `parse` refuses (ValueError) is a RingcommError naming its rank."""
    key = f"{prefix}/state/{{}}"
    got = _compare_set(store, key.format(rank), "vote:" + vote, what)
    if not got.startswith("vote:"):
        raise RingcommError(
            f"ringcomm: {what} on rank {rank}: the other ranks declared this rank gone before it voted "
            f"({got[len(_DEAD) + 1:] or 'no reason'}); it is no longer a member of the communicator "
            "(a replacement joins through grow)"
        )
    votes, dead = {rank: parse(got[5:])}, {}
    waiting = [r for r in members if r != rank]
    deadline = time.monotonic() + timeout_s
    pause = _POLL_MIN_S
    while waiting:
        timed_out = time.monotonic() >= deadline
        still = []
        for r in waiting:
            value = _peek(store, key.format(r), what)
            if value is None:
                why = liveness.gone(r) or (f"rank {r} did not join {what} within {timeout_s:.3g} s"
                                           if timed_out else "")
                if not why:
                    still.append(r)
                    continue
                value = _compare_set(store, key.format(r), f"{_DEAD}:{why}", what)
            if value.startswith("vote:"):
                votes[r] = value[5:]
                try:
                    votes[r] = parse(votes[r])
                except ValueError as e:
                    raise RingcommError(f"ringcomm: {what} on rank {rank}: rank {r} voted {votes[r][:40]!r}: "
                                        f"{e}") from None
            elif value.startswith(_DEAD + ":"):
                dead[r] = value[len(_DEAD) + 1:][:300]
            else:
                raise RingcommError(f"ringcomm: {what} on rank {rank}: rank {r}'s entry in the store is malformed "
                                    f"({value[:60]!r}): not a vote and not a death")
        waiting = still
        if waiting:
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
    return votes, dead


def shrink(comm, exclude, timeout_s):
    """The survivors' new communicator (Communicator.shrink)."""
    from ringcomm.communicator import Communicator

    parent = comm
    native = parent._native
    if native is None:
        raise RingcommError("ringcomm: shrink: the communicator is closed (shrink an aborted or revoked one, "
                            "not a closed one)")
    rank, world = parent.rank, parent.world_size
    exclude = sorted(set(exclude or ()))
    if rank in exclude:
        raise ValueError(f"shrink: rank {rank} excludes itself; only the survivors call shrink")
    native.revoke(f"rank {rank} shrinks the communicator")
    if parent._gpu_path is not None:
        parent._gpu_path.abort("the communicator is being shrunk")
    deadline = time.monotonic() + timeout_s
    liveness = Liveness(native, parent._census, rank, parent._found_dead)
    members = [r for r in range(world) if r not in exclude]
    cost_params = native.cost_params()
    attempt = 0
    while True:
        attempt += 1
        parent._shrinks += 1
        base = f"{parent._prefix}/shrink{parent._shrinks}"
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"ringcomm: shrink on rank {rank} did not complete within {timeout_s:.3g} s "
                               f"({attempt - 1} attempts)")
        votes, dead = agree(parent._store, f"{base}/who", rank, members,
                            json.dumps(exclude), liveness, left, "shrink")
        differ = {r: v for r, v in votes.items() if v != json.dumps(exclude)}
        if differ:
            said = "; ".join(f"rank {r} excluded {v}" for r, v in sorted(differ.items())[:8])
            raise CollectiveMismatchError(f"ringcomm: shrink disagreement: rank {rank} excluded {exclude}, but "
                                          f"{said}; every survivor must pass the same exclude list")
        parent._found_dead.update(dead)
        members = [r for r in members if r not in dead]
        new_rank = members.index(rank)
        ranks = [parent._ranks[r] for r in members] if parent._ranks else list(members)
        child, error = None, ""
        try:
            child = Communicator(parent._store, f"{base}/comm", new_rank, len(members), parent._config,
                                 ranks=ranks, cost_params=cost_params, gone=_Mapped(liveness, members).gone)
        except RingcommError as e:  # a member died while it was being built: all build again
            error = str(e)[:300]
        # Every survivor must learn whether every other one got its communicator.
        votes, dead = agree(parent._store, f"{base}/built", new_rank, list(range(len(members))),
                            "ok" if child is not None else "failed", _Mapped(liveness, members),
                            max(0.001, deadline - time.monotonic()), "shrink")
        if not dead and all(v == "ok" for v in votes.values()):
            child._parent_ranks = list(members)
            child._ranks = ranks
            return child
        if child is not None:
            child.abort("a member was lost while the shrunk communicator was being built")
            child.close()
        if not dead:  # no death explains it: every survivor gives up alike
            failed = [members[r] for r, v in sorted(votes.items()) if v != "ok"]
            raise RingcommError(f"ringcomm: shrink on rank {rank}: rank(s) {failed} could not build the new "
                                f"communicator" + (f" (here: {error})" if error else ""))
        lost = {members[r]: why for r, why in dead.items()}
        parent._found_dead.update(lost)
        members = [r for r in members if r not in lost]


class _Mapped:
    """Liveness of the new members, asked by their new ranks."""

    def __init__(self, liveness, members):
        self._liveness, self._members = liveness, members

    def gone(self, r):
        return self._liveness.gone(self._members[r])


# -- growing back ----------------------------------------------------------------
# A process that wants to join job `job` takes a number (store.add on
# {JOIN}/{job}/arrived) and waits for its seat ({JOIN}/{job}/seat/{number}).
# The members of a running communicator call grow() together at a point of
# their choosing (a step boundary): their rank 0 counts who is waiting,
# admits up to `count` of them (seats in arrival order, ranks after the
# members'), and tells the other members through the communicator; then
# members and joiners build the grown communicator under a prefix of its own
# and confirm it with an agreement of all of them. Joiners are authenticated
# like any peer: through the store, which hands out the new communicator's
# TCP secret (docs/security.md). With a join token (grow(token=) / init(join=,
# token=) / RINGCOMM_JOIN_TOKEN) the store is not enough: rank 0 challenges
# each arrival with a random nonce and admits it only if it answers with
# HMAC-SHA256(token, nonce); the token itself never enters the store.
JOIN = "ringcomm/join"
PROOF_WAIT_S = 10.0  # how long rank 0 waits for an arrival's answer to its challenge


def _job_key(job, what):
    return f"{JOIN}/{job}/{what}"


def waiting(store, job):
    """How many processes wait to join `job` (rank 0 of the members asks)."""
    arrived = int(store.add(_job_key(job, "arrived"), 0))
    admitted = int(store.add(_job_key(job, "admitted"), 0))
    return max(0, arrived - admitted)


def join_token(token):
    """The join token as bytes: `token`, else RINGCOMM_JOIN_TOKEN, else None."""
    import os

    if token is None:
        token = os.environ.get("RINGCOMM_JOIN_TOKEN") or None
    if token is None:
        return None
    if isinstance(token, str):
        token = token.encode()
    if not isinstance(token, bytes) or not token:
        raise TypeError("the join token must be a non-empty str or bytes")
    return token


def _proof(token, challenge):
    import hashlib
    import hmac

    return hmac.new(token or b"", challenge.encode(), hashlib.sha256).hexdigest()


def _screen(store, job, numbers, token, timeout_s):
    """Rank 0: the arrivals among `numbers` that answer the challenge (all of
    them without a token); the others are told they are refused."""
    import hmac
    import secrets
    import sys

    if token is None:
        return list(numbers)
    challenges = {}
    for i in numbers:
        challenges[i] = secrets.token_hex(16)
        store.set(_job_key(job, f"challenge/{i}"), challenges[i])
    admitted, deadline = [], time.monotonic() + min(PROOF_WAIT_S, timeout_s)
    for i in numbers:
        key = _job_key(job, f"proof/{i}")
        while not store.check([key]) and time.monotonic() < deadline:
            time.sleep(0.005)
        answer = _text(store.get(key)) if store.check([key]) else ""
        if hmac.compare_digest(answer.encode(), _proof(token, challenges[i]).encode()):
            admitted.append(i)
            continue
        why = "no answer to the join challenge" if not answer else "a wrong join token"
        store.set(_job_key(job, f"seat/{i}"), json.dumps({"refused": why}))
        sys.stderr.write(f"ringcomm: grow of job {job!r} refused arrival {i}: {why}\n")
    return admitted


def grow(comm, count, job, timeout_s, token=None):
    """The members' side of growing (Communicator.grow)."""
    import numpy as np

    store, rank, world = comm._store, comm.rank, comm.world_size
    head = np.zeros(1, np.int64)  # how many are admitted now
    seats = []
    if rank == 0:
        ready = waiting(store, job)
        take = ready if count is None else min(count, ready)
        first = int(store.add(_job_key(job, "admitted"), take)) - take + 1
        seats = _screen(store, job, range(first, first + take), token, timeout_s)
        head[0] = len(seats)
    comm.broadcast(head, 0)
    if int(head[0]) == 0:
        return comm
    numbers = np.array(seats if rank == 0 else [0] * int(head[0]), np.int64)
    comm.broadcast(numbers, 0)
    comm._grows += 1
    base = f"{comm._prefix}/grow{comm._grows}"
    new_world = world + len(numbers)
    cost_params = comm._c().cost_params()
    if rank == 0:
        for k, i in enumerate(numbers):
            seat = {"prefix": base, "rank": world + k, "world": new_world, "cost_params": cost_params,
                    "timeout_s": timeout_s}
            store.set(_job_key(job, f"seat/{int(i)}"), json.dumps(seat))
    return _build_grown(store, base, rank, new_world, comm._config, cost_params, timeout_s, rank)


def join(store, job, config, timeout_s, token=None):
    """The joiner's side (ringcomm.init(join=...)): waits for a seat (answering
    rank 0's challenge with the token, when it sends one), then builds."""
    number = int(store.add(_job_key(job, "arrived"), 1))
    key = _job_key(job, f"seat/{number}")
    challenge = _job_key(job, f"challenge/{number}")
    deadline, pause, answered = time.monotonic() + timeout_s, _POLL_MIN_S, False
    while not store.check([key]):
        if not answered and store.check([challenge]):
            store.set(_job_key(job, f"proof/{number}"), _proof(token, _text(store.get(challenge))))
            answered = True
        if time.monotonic() >= deadline:
            raise TimeoutError(f"ringcomm: init(join={job!r}): not admitted within {timeout_s:.3g} s (arrival "
                               f"{number}); the members admit joiners when they call comm.grow(job={job!r})")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    try:
        seat = json.loads(_text(store.get(key)))
        if isinstance(seat, dict) and "refused" in seat:
            raise RingcommError(f"ringcomm: init(join={job!r}): the members refused this process: "
                                f"{str(seat['refused'])[:200]}")
        base, rank, world, params = seat["prefix"], seat["rank"], seat["world"], seat["cost_params"]
        if not (isinstance(base, str) and isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world
                and world <= (1 << 31) - 1 and isinstance(params, dict)):
            raise ValueError("fields out of range")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise RingcommError(f"ringcomm: init(join={job!r}): the seat the members published ({key}) is malformed: "
                            f"{e}") from None
    return _build_grown(store, base, rank, world, config, params, timeout_s, None)


def _build_grown(store, base, rank, world, config, cost_params, timeout_s, member_rank):
    from ringcomm.communicator import Communicator

    deadline = time.monotonic() + timeout_s
    child, error = None, ""
    try:
        child = Communicator(store, f"{base}/comm", rank, world, config, cost_params=cost_params)
    except RingcommError as e:
        error = str(e)[:300]
    nobody = Liveness(None, None, rank)
    votes, dead = agree(store, f"{base}/built", rank, list(range(world)), "ok" if child is not None else "failed",
                        nobody, max(0.001, deadline - time.monotonic()), "grow")
    if not dead and all(v == "ok" for v in votes.values()):
        return child
    if child is not None:
        child.abort("a rank could not build the grown communicator")
        child.close()
    failed = sorted([r for r, v in votes.items() if v != "ok"] + list(dead))
    raise RingcommError(f"ringcomm: grow: rank(s) {failed} of the grown communicator could not build it"
                        + (f" (here: {error})" if error else "")
                        + ("; the members' communicator is unchanged" if member_rank is not None else ""))

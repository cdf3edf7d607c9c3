"""Fuzzes ringcomm.validate.record: whatever bytes a peer left in the store,
the only exception it may raise is ringcomm.RingcommError. Any other
exception is a crash (atheris reports it and writes the input to crash-*).

    pip install atheris            # or: pip install -e '.[fuzz]'
    python fuzz/fuzz_store_records.py -atheris_runs=200000

Extra arguments go to libFuzzer (-max_len=, -dict=, a corpus folder, ...).
Without a corpus folder the run starts from SEEDS (valid records and near
misses), copied into a temporary folder, with a dictionary of JSON tokens
and the schema's keys.

json's scanner is C code that atheris cannot see, so byte-level mutations
alone almost never get past it (measured: 12 of 200,000 inputs parsed as a
record). mutate(), the custom mutator, therefore half of the time parses the
input as a JSON object and changes it as a record (a key's value replaced by
a near-boundary value of any JSON type, a key dropped, added or repeated, a
different serialisation or encoding), and otherwise mutates bytes.
tests/test_arguments.py feeds target() a bounded set of random and mutated
inputs from the same mutate(), without atheris.
"""
import copy
import json
import os
import random
import sys
import tempfile

if __name__ == "__main__":
    import atheris

    # Coverage of the validator and the pure-Python part of json guides the
    # mutations (ringcomm's package __init__ imports json first: include it).
    with atheris.instrument_imports(include=["ringcomm.validate", "json"]):
        from ringcomm import validate
        from ringcomm.errors import RingcommError
else:
    from ringcomm import validate
    from ringcomm.errors import RingcommError

# A peer record like the one bootstrap publishes (host, shm segment, TCP
# address, the communicator's secret, the ranks of a split).
SCHEMA = {
    "host": validate.text(255),
    "segment": validate.text(64, pattern=r"/ringcomm-[0-9a-f]{32}"),
    "pid": validate.integer(1, (1 << 22)),
    "tcp": validate.pair(validate.text(64, pattern=r"[0-9A-Za-z.:%\[\]-]+"), validate.integer(1, 65535)),
    "secret": validate.hex_text(32),
    "ranks": validate.optional(validate.list_of(validate.integer(0, (1 << 31) - 1), 65536)),
}

VALID = {
    "host": "vm/860acdef-ebc8-4e97-a033-c192f7834d46",
    "segment": "/ringcomm-41ee9cd6218fb5599ee266ab0ad03172",
    "pid": 4242,
    "tcp": ["127.0.0.1", 29500],
    "secret": "ab" * 32,
    "ranks": [0, 2, 5],
    "transport": "auto",
}

SEEDS = [
    json.dumps(VALID).encode(),
    json.dumps({**VALID, "ranks": None}).encode(),
    json.dumps({k: v for k, v in VALID.items() if k != "ranks"}).encode(),
    json.dumps({**VALID, "pid": True}).encode(),
    json.dumps({**VALID, "tcp": ["::1", 70000]}).encode(),
    json.dumps({**VALID, "secret": "zz" * 32}).encode(),
    json.dumps({**VALID, "host": "\ud800"}).encode(),
    json.dumps([VALID]).encode(),
    b'{"host": "h", "host": "h"}',
    b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
    b'{"pid": NaN}',
    b"\xff\xfe{}",
]

DICTIONARY = ['"host"', '"segment"', '"pid"', '"tcp"', '"secret"', '"ranks"', '"/ringcomm-"',
              "null", "true", "false", "NaN", "Infinity", "-Infinity", "1e999", '"\\ud800"', '"\\u0000"',
              "[", "]", "{", "}", ":", ",", '"', "\\"]


HEX32 = "0123456789abcdef" * 2

_INTS = [0, 1, -1, 7, 4242, 65535, 65536, (1 << 22), (1 << 22) + 1, (1 << 31) - 1, 1 << 31, 1 << 63,
         -(1 << 63), 10 ** 30, 10 ** 400]
_FLOATS = [0.0, -0.0, 1.5, 4242.0, 1e308, 1e-300, 29500.0]
_STRINGS = ["", "a", "a" * 63, "a" * 64, "a" * 65, "h" * 255, "h" * 256, "ab" * 32, "AB" * 32, "ab" * 31 + "a",
            "ab" * 33, "zz" * 32, "/ringcomm-" + HEX32, "/ringcomm-" + HEX32 + "\n", "/ringcomm-" + HEX32.upper(),
            "/ringcomm-" + HEX32[:-1], "127.0.0.1", "::1", "fe80::1%eth0", "[::1]", "a\x00b", "a\nb", "\x7f",
            "\ud800", "a\udfffb", "\u00e9t\u00e9", "\U0001f600", "29500", "true", "null", "host"]
_KEYS = list(SCHEMA) + ["transport", "slot_bytes", "", "\ud800", "HOST"]


def _random_value(rng, depth=0):
    """A JSON value, biased to what sits at the schema's boundaries."""
    kind = rng.randrange(10 if depth < 3 else 6)
    if kind == 0:
        return rng.choice(_INTS) + rng.choice([0, 0, 0, 1, -1])
    if kind == 1:
        return rng.choice(_FLOATS)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4, 5):
        text = rng.choice(_STRINGS)
        if rng.random() < 0.2:
            text += chr(rng.randrange(0x110000))
        return text
    if kind in (6, 7):
        n = rng.choice([0, 1, 2, 2, 3, 5]) if rng.random() > 0.005 else 65537
        if n > 100:
            return [0] * n
        return [_random_value(rng, depth + 1) for _ in range(n)]
    if kind == 8:
        return [rng.choice(_STRINGS[16:20]), rng.choice(_INTS)]  # a near-valid tcp pair
    return {rng.choice(_KEYS): _random_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _mutate_record(rng, record):
    for _ in range(rng.choice([1, 1, 2, 3])):
        op = rng.randrange(8)
        key = rng.choice(_KEYS)
        if op <= 2:
            record[key] = _random_value(rng)
        elif op == 3:
            record.pop(key, None)
        elif op == 4 and isinstance(record.get(key), list) and record[key]:
            items = record[key]
            items[rng.randrange(len(items))] = _random_value(rng, 1)
        elif op == 5:
            return _random_value(rng)  # not an object at all
        elif op == 6:
            record = copy.deepcopy(VALID)
        else:
            record[key] = copy.deepcopy(VALID.get(key))  # repair one key
    return record


def _serialise(rng, record):
    text = json.dumps(record, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1]))
    if rng.random() < 0.05 and text.startswith("{") and len(text) > 2:
        key = rng.choice(list(SCHEMA))
        text = "{" + json.dumps(key) + ": 1, " + text[1:]  # the key twice
    # Lone surrogates survive ensure_ascii=False: surrogatepass writes them as
    # the CESU bytes a careless peer might send (not UTF-8).
    return text.encode("utf-8", "surrogatepass")


def _byte_mutate(rng, data, max_size):
    """A plain byte mutation (what libFuzzer does, in pure Python)."""
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 4])):
        op = rng.randrange(5)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5)))
        elif op == 2 and data:
            del data[pos:pos + rng.randrange(1, 9)]
        elif op == 3:
            data[pos:pos] = rng.choice(DICTIONARY).encode()
        elif data:
            other = rng.choice(SEEDS)
            start = rng.randrange(len(other))
            data[pos:] = other[start:start + rng.randrange(1, 64)] + data[pos:]
    return bytes(data[:max_size])


def mutate(data, max_size, seed, byte_mutator=None):
    """The custom mutator: `data` is one input (mode byte + record bytes)."""
    rng = random.Random(seed)
    mode = data[:1] if data and rng.random() > 0.1 else bytes([rng.randrange(4)])
    body = data[1:]
    if rng.random() < 0.5:
        try:
            record = json.loads(body.decode("utf-8"))
        except (ValueError, RecursionError):
            record = copy.deepcopy(VALID)
        if not isinstance(record, dict) or rng.random() < 0.3:
            record = copy.deepcopy(VALID)  # one change from a valid record: every key's checks get reached
        out = _serialise(rng, _mutate_record(rng, record))
    elif byte_mutator is not None:
        out = byte_mutator(body, max(1, max_size - 1))
    else:
        out = _byte_mutate(rng, body, max(1, max_size - 1))
    return (mode + out)[:max_size]


def target(data):
    """One input: byte 0 picks how the rest reaches record() (bytes, str,
    bytearray, memoryview), as different stores hand values back."""
    if not data:
        raw = b""
    else:
        mode, body = data[0] % 4, data[1:]
        raw = (body, body.decode("latin-1"), bytearray(body), memoryview(body))[mode]
    try:
        validate.record(raw, 3, SCHEMA)
    except RingcommError:
        pass


def _prepare_args(argv):
    """Adds a seeded temporary corpus and the dictionary unless given."""
    args = list(argv)
    tmp = tempfile.mkdtemp(prefix="ringcomm-fuzz-")
    if not any(not a.startswith("-") for a in args[1:]):
        corpus = os.path.join(tmp, "corpus")
        os.makedirs(corpus)
        for i, seed in enumerate(SEEDS):
            for mode in range(4):
                with open(os.path.join(corpus, f"seed-{i}-{mode}"), "wb") as f:
                    f.write(bytes([mode]) + seed)
        args.append(corpus)
    if not any(a.startswith("-dict=") for a in args):
        path = os.path.join(tmp, "tokens.dict")
        with open(path, "w") as f:
            for token in DICTIONARY:
                f.write(json.dumps(token) + "\n")
        args.append(f"-dict={path}")
    return args


def main():
    def custom_mutator(data, max_size, seed):
        return mutate(data, max_size, seed, atheris.Mutate)

    atheris.Setup(_prepare_args(sys.argv), target, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

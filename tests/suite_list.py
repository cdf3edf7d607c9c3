"""The list format of tests/torch_dist_suite.py --list (tests/torch_dist_suite_ci.txt).

One test of torch's DistributedTest per line, by its method name; `#` starts a
comment; blank lines are skipped. A name alone runs at every world size; a name
followed by world sizes (space or comma separated: ``test_foo 2`` or
``test_foo 2,3``) runs only when the suite's --world-size is one of them.
"""


def read_list(path, world_size):
    """The names `path` lists for a run at `world_size`, in file order (ValueError
    naming the line for a world size that is not a positive integer)."""
    names = []
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#")[0].strip()
            if not line:
                continue
            name, _, sizes = line.partition(" ")
            wanted = sizes.replace(",", " ").split()
            if not all(s.isdigit() and int(s) > 0 for s in wanted):
                raise ValueError(f"{path}:{number}: world sizes must be positive integers, got {sizes.strip()!r}")
            if not wanted or world_size in {int(s) for s in wanted}:
                names.append(name)
    return names

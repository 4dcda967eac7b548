"""reasoning-gym's generators in a child interpreter, so that a seed gives the same problems in every run.

Two things make a generator's problems differ between runs of the same seed, and this process
fixes both:

- Some draw from a set of strings (isomorphic_strings: ``rng.choice(list(letters - used))``),
  whose order follows the string hashing Python randomises per process: this one is started with
  ``PYTHONHASHSEED=0``.
- list_functions draws from the ``random`` module, and some of codeio's programs from numpy's,
  which no seed of reasoning-gym's reaches: both are seeded here before each problem, from the
  generator's seed and the problem's index. (A program drawing from the operating system's
  entropy, as codeio's using ``secrets`` do, still gives another answer in each run.)

:mod:`podsrl.tasks.gym` asks this process for its problems. It imports nothing of podsrl (nor
torch): requests and replies are pickles on stdin and stdout.

A request: ``(specs, seed, size, start, stop)``, ``specs`` a list of ``(name, weight, settings)``
(one: that data set; more: reasoning-gym's composite of them). The reply: ``(entries, error)``,
the entries ``start`` to ``stop`` of the generator seeded ``seed``, up to the first one it could
not make, and then that one's error as a line (``None`` where all were made).
"""

import pickle
import random
import signal
import sys
import zlib

try:  # reasoning-gym needs it; its global generator is seeded as random's
    import numpy
except ImportError:
    numpy = None

KEEP = 4
"""Generator instances kept between requests (a training chunk is asked for in blocks)."""


def make(specs, seed, size):
    if len(specs) == 1:
        from reasoning_gym import create_dataset

        name, _, settings = specs[0]
        return create_dataset(name, **settings, seed=seed, size=size)
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    return CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=[DatasetSpec(*s) for s in specs]))


def seed_globals(seed: int, index: int) -> None:
    """The ``random`` module's and numpy's global generators, seeded for problem ``index``."""
    key = f"podsrl-gym-{seed}-{index}"
    random.seed(key)
    if numpy is not None:
        numpy.random.seed(zlib.crc32(key.encode()))


def serve(requests, replies) -> None:
    kept = {}
    while True:
        try:
            specs, seed, size, start, stop = pickle.load(requests)
        except EOFError:
            return
        entries, error = [], None
        try:
            key = (repr(specs), seed, size)
            if key not in kept:
                if len(kept) >= KEEP:
                    kept.pop(next(iter(kept)))
                kept[key] = make(specs, seed, size)
            for index in range(start, stop):
                seed_globals(seed, index)
                entries.append(kept[key][index])
        except Exception as e:  # noqa: BLE001 (whatever a generator raises, said by the parent)
            error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
        pickle.dump((entries, error), replies)
        replies.flush()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; its exit ends the requests
    replies = sys.stdout.buffer
    sys.stdout = sys.stderr  # a generator's print must not reach the replies
    serve(sys.stdin.buffer, replies)

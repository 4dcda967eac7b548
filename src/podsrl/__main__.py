import sys

from podsrl.cli import main

if __name__ == "__main__":  # not in a process that multiprocessing spawns (the generation worker)
    sys.exit(main())

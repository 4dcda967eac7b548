import sys

from podsrl.cli import main

sys.exit(main())

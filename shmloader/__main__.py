import sys

from shmloader.cli.main import main

sys.exit(main())

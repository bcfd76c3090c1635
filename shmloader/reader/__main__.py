import sys

from shmloader.reader.process import main

sys.exit(main())

import sys

from trainspeed.cli.main import main

sys.exit(main())

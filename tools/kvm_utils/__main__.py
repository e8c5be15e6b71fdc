"""`python -m tools.kvm_utils`."""

import sys

from tools.kvm_utils.cli import main

sys.exit(main())

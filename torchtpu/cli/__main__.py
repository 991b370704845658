"""`python -m torchtpu.cli`: the `torchtpu` command."""
import sys

from torchtpu.cli import main

sys.exit(main())

"""localrun: run language models on the machine in front of you.

Importing this package is cheap on purpose: no runtime library, no UI library and no I/O
happens at import time (a test checks it), so ``localrun --help`` starts fast.
"""

__version__ = "0.1.0"

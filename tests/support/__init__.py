"""What the tests share: how a server is launched and started, the capability set, network
hosts. No tests live here; ``fixtures`` is the pytest plugin (registered in tests/conftest.py)."""

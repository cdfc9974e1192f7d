"""The benchmark suites (`python -m bench --list`)."""

"""The ``make test-real`` tier: published packages from the registry, run as their users run them."""

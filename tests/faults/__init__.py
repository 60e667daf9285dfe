"""Fault and race suites: randomized crashes, concurrent clicks, poison input, against the real stack."""

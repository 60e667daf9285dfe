"""Browser tests: a real Chromium (Debian's) driven by Playwright against the real stack."""

"""Research that no deployment serves: tools whose results pages (docs/results/) say what they
measured, kept runnable from a checkout but outside the product (the wheel installs src/ only).
research/README.md says what is here and how to run each."""

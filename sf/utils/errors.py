"""The two kinds of user-facing failure. Entry points print either as one line (`sf.cfg.run_guarded`) and exit with
code 2 (ConfigError: the input is wrong) or 1 (RunError: something else failed, e.g. an I/O error)."""


class ConfigError(ValueError):
    """A user mistake in the configuration: a one-line message naming the flag (or file and key) and what is
    allowed. Entry points exit with code 2."""


class RunError(Exception):
    """A failure that is not a mistake in the input (e.g. an OS error writing config.json): a one-line message
    naming what failed. Entry points print it and exit with code 1."""

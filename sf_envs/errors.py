"""Errors of the env registry. Both are ValueErrors whose message is one line, so that entry points can
print them as they are and exit with code 2."""


class UnknownEnvError(ValueError):
    """The env name is not registered; the message lists close matches."""


class EnvUnavailableError(ValueError):
    """The env is registered but cannot run here (a package or data is missing); the message says how to fix it."""

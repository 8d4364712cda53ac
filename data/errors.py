"""The one error type of the data package."""


class DataError(ValueError):
    """Bad input data or settings.

    The message names the file (and line or row where one applies), what is wrong, and how to fix it.
    A subclass of ValueError so callers that catch ValueError keep working.
    """

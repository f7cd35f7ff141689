"""psd: Python client of the psd parameter-server service, over libpsclient (ctypes).

    import numpy as np, psd
    with psd.Client({"ps": ["127.0.0.1:2222"]}, deadline_ms=5000) as c:
        w = c.create_variable("dense/w", (784, 256), initializer="glorot_uniform", seed=1,
                              optimizer="adam", learning_rate=1e-3)
        params = w.pull()                  # a new float32 array of w's shape
        w.pull(params)                     # or into your own array, in place
        w.push(np.ones(w.shape, np.float32))
        fut = w.push_async(grad)           # concurrent.futures.Future
        fut.result()
        c.clock()

Tensor data is never copied by this package: pulls write into, and pushes read from, the
memory of the array given (NumPy arrays, PyTorch CPU tensors, buffer-protocol objects of
float32). Failures raise a subclass of PsError with .status and .message.
"""

from . import errors
from ._native import LibraryNotFoundError, library_path
from .client import (STALENESS_ASYNC, STALENESS_BSP, STALENESS_DEFAULT, Client, ServerStatus,
                     StalenessStats, Table, Variable, optimizer_name, optimizer_parse, version)
from .errors import (AlreadyExistsError, CancelledError, DeadlineExceededError,
                     FailedPreconditionError, InternalError, InvalidArgumentError,
                     NotFoundError, OutOfRangeError, PsError, ResourceExhaustedError,
                     UnavailableError)

__version__ = "0.1.0"

__all__ = [
    "Client", "Variable", "Table", "ServerStatus", "StalenessStats", "version", "optimizer_parse",
    "optimizer_name", "library_path", "STALENESS_ASYNC", "STALENESS_BSP", "STALENESS_DEFAULT",
    "PsError", "CancelledError", "InvalidArgumentError", "DeadlineExceededError",
    "NotFoundError", "AlreadyExistsError", "FailedPreconditionError", "OutOfRangeError",
    "ResourceExhaustedError", "InternalError", "UnavailableError", "LibraryNotFoundError",
    "errors",
]

"""Variable.assign and assign_async: values written as they are (no optimizer step), over
shards and chunks, with the same buffer checks as push."""

import numpy as np
import pytest

import psd


def test_assign_writes_values_exactly(client, uname):
    v = client.create_variable(uname, (80, 100), initializer="uniform", init_a=-1, init_b=1,
                               optimizer="adam", learning_rate=0.1,
                               staleness=psd.STALENESS_BSP)
    assert v.num_shards == 2  # 32000 bytes: over the test client's 16K split threshold
    x = np.arange(8000, dtype=np.float32).reshape(80, 100) / np.float32(3)
    v.assign(x)
    np.testing.assert_array_equal(v.pull(), x)
    part = np.full(7, 0.25, np.float32)
    v.assign_async(part, offset=3997).result()
    x.reshape(-1)[3997:4004] = part
    np.testing.assert_array_equal(v.pull(), x)


def test_assign_refuses_bad_buffers(client, uname):
    v = client.create_variable(uname, (3, 4))
    with pytest.raises(ValueError, match="assign of .*12"):
        v.assign(np.zeros(5, np.float32))
    with pytest.raises(TypeError, match="float32"):
        v.assign(np.zeros((3, 4), np.float64))
    with pytest.raises(psd.OutOfRangeError):
        v.assign(np.zeros(4, np.float32), offset=10)

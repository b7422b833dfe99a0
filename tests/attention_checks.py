"""Comparing an attention's (context, dq, dk, dv, dtable) with the reference's."""
import numpy as np

NAMES = ("ctx", "dq", "dk", "dv", "dtable")


def assert_float32_close(ref, fused) -> None:
  """Every output and gradient to 1e-5."""
  for name, a, b in zip(NAMES, ref, fused):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5,
                               rtol=1e-5, err_msg=name)


def assert_bfloat16_close(ref, fused) -> None:
  """Every output and gradient to bfloat16's tolerance, scaled by the
  reference's largest value."""
  for name, a, b in zip(NAMES, ref, fused):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    scale = max(1.0, float(np.abs(a).max()))
    np.testing.assert_allclose(b, a, atol=3e-2 * scale, err_msg=name)

"""Checkpoint readers and writers: HF, T5X, original FiD; one rename table.

Every reader returns ``(fields, flat_params)``: the T5Config fields (a dict,
HF field names, ``jaxfid.t5.config.T5Config(**fields)``) and the
parameters as a flat dict of float32 numpy arrays named as jaxfid (and T5X)
names them, '/'-joined: ``encoder/layers_0/attention/query/kernel``. Bad user
files raise :class:`jaxfid.core.errors.InputError` naming file and tensor.

* :mod:`.names`: the rename table jaxfid <-> HF (and the FiD wrapper names),
  parameter shapes and counts;
* :mod:`.configs`: config.json <-> fields, fields from T5X parameter shapes;
* :mod:`.hf`: ``read_hf`` / ``write_hf`` (safetensors, sharded, torch .bin);
* :mod:`.torch_bin`: ``pytorch_model.bin`` read without torch;
* :mod:`.t5x`: ``read_t5x`` / ``write_t5x`` (msgpack + TensorStore, orbax);
* :mod:`.detect`: ``detect_format``, ``load_flat``, ``register_loader``.
"""
from jaxfid.checkpoints.configs import (FIELDS, as_fields, config_from_hf_json,
                                        config_from_params,
                                        hf_json_from_config)
from jaxfid.checkpoints.detect import (FORMATS, detect_format, load_flat,
                                       register_loader)
from jaxfid.checkpoints.hf import check_params, read_hf, write_hf
from jaxfid.checkpoints.names import (describe, fid_wrapper_to_hf,
                                      param_shapes, renames)
from jaxfid.checkpoints.t5x import read_t5x, write_t5x

__all__ = [
    "FIELDS", "FORMATS", "as_fields", "check_params", "config_from_hf_json",
    "config_from_params", "describe", "detect_format", "fid_wrapper_to_hf",
    "hf_json_from_config", "load_flat", "param_shapes", "read_hf", "read_t5x",
    "register_loader", "renames", "write_hf", "write_t5x",
]

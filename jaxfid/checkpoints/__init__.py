"""Checkpoint readers and writers: HF, T5X, original FiD; one rename table.

Every reader returns ``(fields, flat_params)``: T5Config fields (HF names)
and float32 numpy parameters named as jaxfid (and T5X) name them,
``encoder/layers_0/attention/query/kernel``. Bad user files raise
:class:`jaxfid.core.errors.InputError` naming file and tensor.
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

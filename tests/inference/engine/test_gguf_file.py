"""Our GGUF header parser against gguf-py's reader on the bundled model."""

import pytest
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from inference.engine.loading.gguf_file import open_gguf, read_metadata, read_tensors

pytestmark = pytest.mark.real_model


def test_metadata_and_tensors_equal_gguf_py(smollm2_gguf_path):
    ours = open_gguf(smollm2_gguf_path)
    metadata = read_metadata(ours)
    reference = GGUFReader(smollm2_gguf_path)
    expected = {k: f.contents() for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert metadata == expected
    tensors = read_tensors(ours)
    assert sorted(tensors) == sorted(t.name for t in reference.tensors)
    for tensor in reference.tensors[:12]:  # F32 norms, Q8_0 embeddings and Q4_1 weights
        shape = tuple(reversed(tensor.shape.tolist()))
        want = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).reshape(shape))
        assert torch.equal(tensors[tensor.name], want.float()), tensor.name


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ValueError, match="not a GGUF file"):
        open_gguf(bogus)
    with pytest.raises(ValueError, match="not found"):
        open_gguf(tmp_path / "missing.gguf")

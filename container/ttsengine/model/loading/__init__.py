"""Weight I/O: reading a model directory's files into the model's modules (checkpoint, weights, upload, readahead,
the codec cache), writing a model directory (checkpoint_writer, codec_file_layout), random weights (synthetic) and
copying a loaded module to another device (replicate). The math they fill lives one folder up and never imports
this one (tests/test_imports.py)."""

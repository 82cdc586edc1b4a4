"""The ``gpupool`` command line: thin commands that call the library and report domain errors."""

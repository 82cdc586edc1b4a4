"""``gpupool init``: the model and GPU catalogue, and the short policy it writes."""

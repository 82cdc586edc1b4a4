"""Pulumi entry point (``main: infra/`` in Pulumi.yaml): read stack config, declare the bundle."""

import pulumi

from infra.program import read_settings, run

components = run(read_settings(pulumi.Config("gpupool")))

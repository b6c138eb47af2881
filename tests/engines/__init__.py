"""Engine adapters (in-process, Ray, Flower) run against one conformance suite."""

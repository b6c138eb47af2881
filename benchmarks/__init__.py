"""fedgat's benchmarks, shipped in the wheel as :mod:`fedgat.benchmarks` (``fedgat bench`` imports
them): ``overhead`` (encrypted vs plaintext pre-training), ``layer_speed`` (FedGAT layer vs PyG
``GATConv``), ``accuracy`` (the accuracy experiments) and ``scale`` (in-process vs Ray). Each also runs
as a script from a source checkout, ``python benchmarks/<name>.py``, writing into ``benchmarks/results``
(not shipped); ``fedgat bench <name>`` writes into ``--out`` (default ``./fedgat-results``)."""

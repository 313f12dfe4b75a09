"""The built-in algorithms' summaries, written by `python -m rayfl.algorithms` from their registrations
(`Algorithm.summary`), so `rayfl list` shows them without importing torch; tests/test_usersday.py
fails when it is stale."""

ALGORITHMS = {
    "adasfl": "AdaSFL (MergeSFL's baseline): split FL with batch regulation only",
    "alllarge": "AllLarge: FedAvg at full width on every client (HeteroFL baseline)",
    "alllarge_depth": "AllLarge (InclusiveFL baseline): FedAdam on the largest depth, every client",
    "allsmall": "AllSmall: FedAvg at the smallest level on every client (HeteroFL baseline)",
    "allsmall_depth": "AllSmall (InclusiveFL baseline): FedAdam on the smallest depth, every client",
    "depthfl": "DepthFL (Kim et al. 2023): depth-scaled prefixes by memory budget, self-distillation among exits, "
    "FedDyn",
    "ditto": "Ditto (Li et al. 2021): FedAvg plus per-client personal models pulled towards it by lambda",
    "efedsup": "E-FedSup (Kim & Yun 2023): one FLOPs-fitting sub-net per client by tier, only the sub-net travels",
    "exclusivefl": "ExclusiveFL: FedAvg at full width on the clients that fit it (HeteroFL baseline)",
    "exclusivefl_depth": "ExclusiveFL (InclusiveFL baseline): FedAdam on the largest depth, strongest class only",
    "fedadagrad": "FedAdagrad (Reddi et al. 2021): adaptive server optimizer",
    "fedadam": "FedAdam (Reddi et al. 2021): adaptive server optimizer",
    "fedavg": "FedAvg (McMahan et al. 2017): sample-weighted model averaging",
    "fedepth": "FeDepth (Zhang et al. 2023): memory-adaptive depth-wise training of the full model, skip links to "
    "the head",
    "fedprox": "FedProx (Li et al. 2020): FedAvg with a proximal term mu",
    "fedsup": "FedSup (Kim & Yun 2023): supernet broadcast, sandwich-sampled sub-nets with in-place distillation per "
    "step",
    "fedyogi": "FedYogi (Reddi et al. 2021): adaptive server optimizer",
    "heterofl": "HeteroFL (Diao et al. 2021): nested width sub-models, per-entry aggregation",
    "inclusivefl": "InclusiveFL (Liu et al. 2022): depth groups, layer-wise aggregation, momentum distillation",
    "lgfedavg": "LG-FedAvg (Liang et al. 2020): local bodies, FedAvg over the global top layers",
    "localonly": "Local-only (FedSup Table 2): each client trains its own model, never averaged",
    "mergesfl": "MergeSFL (Liao et al. 2024): split FL with feature merging, batch regulation, GA selection",
    "mfedepth": "m-FeDepth (Zhang et al. 2023): depth-wise training with auxiliary classifiers per block",
    "perfedavg": "Per-FedAvg (Fallah et al. 2020): MAML-style local steps (FO or HF), personalized by one alpha-step",
    "pyramidfl": "PyramidFL-style selection (MergeSFL baseline): oversample by reward, keep the fastest",
    "sfl": "Typical split FL (SplitFed style): bottom models on workers, top on the server",
    "splitmix": "SplitMix (Hong et al. 2022): K thin base networks, each client trains its budget's share, mixed by "
    "averaging logits",
}

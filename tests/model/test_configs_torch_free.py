"""Reading a model config does not import torch: `hycache.model.configs` stands alone (the
simulator, the CLI's config checks and the cost model parse configs without the model)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_configs_does_not_import_torch() -> None:
    code = (
        "import sys, hycache.model.configs, hycache.model.configs.presets\n"
        "from hycache.model.configs.presets import preset_config\n"
        "from hycache.model.configs import config_from_hf_dict\n"
        "config_from_hf_dict(preset_config('tiny').to_hf_dict())\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_model_package_still_names_its_classes() -> None:
    import hycache.model as model
    from hycache.model.paged import StepBatch

    assert model.StepBatch is StepBatch
    assert "load_model" in dir(model)

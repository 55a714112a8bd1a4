"""From a finished training run to the files a phone and a browser run: `vit-keras train ... --export int8 [--web]`.

    DIR/model_<mode>.tflite  each asked-for quantization, with metadata   (convert.export.export_tflite)
    DIR/verify.md            all of them against DIR/model.keras on the run's held-out images (convert.verify)
    DIR/web/                 the static browser site of the int8 file, else of the first mode (apps.web_export)

Rerunning skips what is done and still matches its inputs, so the command resumes as training does: a .tflite
newer than model.keras is kept, verify.md is rewritten when a file it measured changed, and web/ is rebuilt when
its model is not the current one. Every file is written atomically; the site is built in a temp folder and then
renamed into place.

Standard library only at import: `vit-keras train` checks its flags with this module before Keras loads.
"""

import json
import os
import shutil
import tempfile

from vit_keras.constants import NPU_MODE, SHIP_MODES
from vit_keras.files import write_text

VERIFY_REPORT = "verify.md"
WEB_FOLDER = "web"
WEB_TEMP_PREFIX = ".tmp-web-"
KEPT = "kept (up to date)"
EXPORTED = "exported"
# verify.md ends with this comment: the size and mtime of each file it measured, so a rerun knows if it still holds.
STAMP_PREFIX = "<!-- vit-keras ship inputs: "
STAMP_SUFFIX = " -->"


def parse_modes(modes, name="modes"):
    """A tuple of SHIP_MODES from "int8,float16" or a list; a clear error naming ``name`` otherwise."""
    words = modes.split(",") if isinstance(modes, str) else list(modes)
    words = [str(word).strip() for word in words]
    unknown = [word for word in words if word not in SHIP_MODES]
    if not words or unknown:
        raise ValueError(f"{name} {modes!r}: {'unknown mode ' + repr(unknown[0]) if unknown else 'no mode given'}; "
                         f"valid values are {', '.join(SHIP_MODES)} (several separated by commas).")
    return tuple(dict.fromkeys(words))  # in the order given, each once


def tflite_path(run_dir, mode):
    return os.path.join(run_dir, f"model_{mode}.tflite")


def export_options(mode):
    """export_tflite's (quantize, target) for a ship mode: "npu" is int8 for the npu target."""
    return ("int8", "npu") if mode == NPU_MODE else (mode, "cpu")


def site_mode(modes):
    """The mode the web site runs: int8 (the phone's file) when exported, else the first one a browser runs (the
    npu file's int16 kernels are not in the browser's runtime)."""
    browser = [mode for mode in modes if mode != NPU_MODE]
    if not browser:
        raise ValueError(f"--web needs a mode a browser runs besides {NPU_MODE!r}, e.g. --export int8,npu --web.")
    return "int8" if "int8" in browser else browser[0]


def is_newer(path, than):
    """Whether ``path`` exists and was written no earlier than ``than``."""
    return os.path.isfile(path) and os.stat(path).st_mtime_ns >= os.stat(than).st_mtime_ns


def file_stamp(paths):
    """{file name: [size, mtime_ns]}: what a report was made from."""
    return {os.path.basename(path): [os.stat(path).st_size, os.stat(path).st_mtime_ns] for path in paths}


def read_stamp(report_path):
    """The stamp at the end of a verify.md, or None when the file is missing or carries none."""
    try:
        with open(report_path, encoding="utf-8") as f:
            last = f.read().rstrip().splitlines()[-1]
    except (OSError, IndexError):
        return None
    if not (last.startswith(STAMP_PREFIX) and last.endswith(STAMP_SUFFIX)):
        return None
    try:
        return json.loads(last[len(STAMP_PREFIX):-len(STAMP_SUFFIX)])
    except ValueError:
        return None


def finished_run(run_dir):
    """(model.keras path, config.json record) of a finished run in ``run_dir``, or a clear error."""
    from vit_keras.training.runs import read_json

    model = os.path.join(run_dir, "model.keras")
    config = read_json(os.path.join(run_dir, "config.json"))
    if not (os.path.isfile(model) and config.get("completed")):
        raise FileNotFoundError(f"{run_dir} holds no finished run (model.keras and a completed config.json); "
                                "train it first, e.g. `vit-keras train --out DIR`.")
    return model, config


def calibration_arrays(model_path, config, calibration_size, data_dir=None):
    """The run's own training images, as it split them (seed, held-out fraction), at the model's input size."""
    from vit_keras.data.datasets import load_arrays
    from vit_keras.training.runs import data_split

    return load_arrays(config["data"], split="train", limit=calibration_size, data_dir=data_dir,
                       image_size=tuple(config["vit"]["image_size"]), **data_split(model_path))[0]


def export_modes(model_path, config, modes, calibration_size, data_dir=None, log=print):
    """Each mode's .tflite, exported unless one newer than the model is there. Returns {mode: step}."""
    from vit_keras.convert.export import export_tflite

    run_dir, steps, calibration = os.path.dirname(model_path), {}, None
    for mode in modes:
        path = tflite_path(run_dir, mode)
        if is_newer(path, model_path):
            steps[mode] = KEPT
        else:
            quantize, target = export_options(mode)
            if quantize == "int8" and calibration is None:
                calibration = calibration_arrays(model_path, config, calibration_size, data_dir)
            summary = export_tflite(model_path, path, quantize=quantize, target=target,
                                    calibration=calibration if quantize == "int8" else None,
                                    calibration_size=calibration_size)
            steps[mode] = f"{EXPORTED} ({summary['bytes'] / 1e6:.2f} MB, {summary['input_dtype']} input)"
        log(f"{os.path.basename(path)}: {steps[mode]}")
    return steps


def verify_report(model_path, config, paths, data_dir=None, runs=50, threads=(1, 2), log=print):
    """(report text, step): verify.md as it stands when its inputs are unchanged, else measured and written."""
    from vit_keras.convert.verify import verify_files

    report_path = os.path.join(os.path.dirname(model_path), VERIFY_REPORT)
    stamp = file_stamp([model_path, *paths])
    if read_stamp(report_path) == stamp:
        with open(report_path, encoding="utf-8") as f:
            report, step = f.read().rstrip().rsplit("\n", 1)[0].rstrip(), KEPT
    else:
        report = verify_files(paths, model_path, config["data"], limit=config.get("limit"), runs=runs,
                              threads=threads, data_dir=data_dir)
        write_text(report_path, f"{report}\n\n{STAMP_PREFIX}{json.dumps(stamp, sort_keys=True)}{STAMP_SUFFIX}\n")
        step = "written"
    log(f"{VERIFY_REPORT}: {step}")
    return report, step


def export_web(run_dir, model_path, runtime_dir=None, log=print):
    """web/ for ``model_path`` (a .tflite), rebuilt unless its copy of the model is that file, written since."""
    from vit_keras.apps.web_export import SITE_MODEL, export_site

    site, site_model = os.path.join(run_dir, WEB_FOLDER), os.path.join(run_dir, WEB_FOLDER, SITE_MODEL)
    for name in os.listdir(run_dir):  # a site a kill left half-built
        if name.startswith(WEB_TEMP_PREFIX):
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    if is_newer(site_model, model_path) and os.path.getsize(site_model) == os.path.getsize(model_path):
        step = KEPT
    else:
        building = os.path.join(run_dir, f"{WEB_TEMP_PREFIX}{os.getpid()}")  # makedirs: the usual permissions
        os.makedirs(building)
        try:
            export_site(model_path, building, force=True, runtime_dir=runtime_dir)
            replace_folder(building, site)
        finally:
            shutil.rmtree(building, ignore_errors=True)
        step = EXPORTED
    log(f"{WEB_FOLDER}/: {step} (from {os.path.basename(model_path)})")
    return step


def replace_folder(new, target):
    """``new`` renamed to ``target``; an old ``target`` is moved aside first and removed after, so a reader finds
    the old site or the new one, never a mix."""
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=WEB_TEMP_PREFIX, dir=os.path.dirname(target))
        os.replace(target, os.path.join(old, "site"))
    os.replace(new, target)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def ship_run(run_dir, modes, web=False, calibration_size=None, data_dir=None, runs=50, threads=(1, 2),
             runtime_dir=None, log=print):
    """Export a finished run's model in each of ``modes``, verify the files, and with ``web`` write its site.

    modes: "int8,float16" or a list of SHIP_MODES (a quantization, or "npu": int8 for the npu target); int8 and npu
      calibrate on ``calibration_size`` images of the run's own training part (None: the exporter's default).
    data_dir: the tfds data folder the run read (config.json does not record it).
    runs, threads: verify's timed runs per latency figure and the LiteRT thread counts it times.
    log: where the one line per step goes.
    Returns {"files": {mode: path}, "steps": {mode | "verify.md" | "web/": what happened}, "report": text,
    "web": the site's folder or None}.
    """
    modes = parse_modes(modes, name="`modes`")
    run_dir = os.fspath(run_dir)
    if web:
        site_mode(modes)  # before any export: a mode a browser runs
        from vit_keras.apps.web_export import check_web_runtime

        check_web_runtime(runtime_dir)
    if calibration_size is None:
        from vit_keras.constants import DEFAULT_CALIBRATION_IMAGES

        calibration_size = DEFAULT_CALIBRATION_IMAGES
    model_path, config = finished_run(run_dir)
    steps = export_modes(model_path, config, modes, calibration_size, data_dir, log)
    files = {mode: tflite_path(run_dir, mode) for mode in modes}
    report, steps[VERIFY_REPORT] = verify_report(model_path, config, list(files.values()), data_dir, runs, threads,
                                                 log)
    log(report)
    site = None
    if web:
        steps[f"{WEB_FOLDER}/"] = export_web(run_dir, files[site_mode(modes)], runtime_dir, log)
        site = os.path.join(run_dir, WEB_FOLDER)
    return {"files": files, "steps": steps, "report": report, "web": site}

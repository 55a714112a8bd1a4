"""`vit-keras export-web MODEL.tflite --out DIR [--force]`: a static site that classifies in the visitor's browser."""

from vit_keras.apps.commands import positive_int

HELP = "Write a static web site that runs a .tflite classifier in the browser (MediaPipe Tasks Vision, offline)."


def add_arguments(parser):
    parser.add_argument("model", help="a .tflite exported by `vit-keras export` (labels in its metadata)")
    parser.add_argument("--out", required=True, help="the site's folder (new or empty)")
    parser.add_argument("--force", action="store_true", help="write into a folder that is not empty (files of the "
                                                             "site's names are replaced, others are left)")
    parser.add_argument("--top-k", type=positive_int, default=5, help="labels shown (default 5)")
    parser.add_argument("--runtime-dir", default=None, metavar="DIR",
                        help="an npm install of @mediapipe/tasks-vision (default: the one scripts/setup.sh makes)")


def run(args):
    from vit_keras.apps.web_export import export_site

    summary = export_site(args.model, args.out, force=args.force, top_k=args.top_k, runtime_dir=args.runtime_dir)
    print(f"wrote {summary['path']} ({len(summary['files'])} files, {summary['bytes'] / 1e6:.1f} MB): serve it with "
          f"any static file server, e.g. `python -m http.server -d {summary['path']}`, or "
          f"`vit-keras serve {args.model} --in-browser`")
    return 0

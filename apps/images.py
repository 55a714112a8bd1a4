"""Decode any image a user may hand the app into an 8-bit RGB array, or fail with a clear ImageError.

Handles: grayscale / RGBA / CMYK / palette / 16-bit images, EXIF orientation, animated images (first
frame), huge images (decoded at reduced size where the format allows) and refuses decompression bombs,
truncated files, empty files and non-images with a message a person can act on.
"""

import os
import struct
import warnings

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

# Pillow warns above MAX_IMAGE_PIXELS and raises above twice that; the app refuses both.
MAX_PIXELS = 64_000_000
Image.MAX_IMAGE_PIXELS = MAX_PIXELS
ImageFile.LOAD_TRUNCATED_IMAGES = False
IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


class ImageError(ValueError):
    """An input that cannot be classified, with a message meant for the user."""


def _flatten_alpha(image):
    """RGBA/LA/transparent palette -> RGB on a white background (what a viewer shows)."""
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _to_8bit(image):
    """16/32-bit integer and float images -> 'L'. 16-bit data spans 0-65535 (scaled by 1/257, so the
    picture is not changed); float data is taken as 0-1 when it fits, else clipped to 0-255."""
    array = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        array = array * 255.0 if array.size and array.min() >= 0 and array.max() <= 1.0 else array
    elif image.mode.startswith("I;16") or (array.size and array.max() > 255):
        array = array / 257.0
    return Image.fromarray(np.clip(array + 0.5, 0, 255).astype(np.uint8), "L")


def normalize_mode(image):
    """Any Pillow image -> 'RGB' or 'L'."""
    if image.mode in ("RGB", "L"):
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        return _to_8bit(image)
    if image.mode == "1":
        return image.convert("L")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (image.mode == "P" and "transparency" in image.info):
        return _flatten_alpha(image)
    return image.convert("RGB")  # P, CMYK, YCbCr, LAB, HSV


def load_image(path, target_size=None):
    """Open ``path`` -> (8-bit 'RGB' or 'L' PIL image, original (width, height)).

    ``target_size`` (width, height), when given, lets JPEG decode at a reduced scale near it.
    """
    path = os.fspath(path)
    name = os.path.basename(path)
    if os.path.isdir(path):
        raise ImageError(f"{name}: is a folder, not an image")
    try:
        empty = os.path.getsize(path) == 0
    except OSError as error:  # gone, a broken symlink, unreadable
        raise ImageError(f"{name}: cannot be read ({error.strerror or error})") from None
    if empty:
        raise ImageError(f"{name}: the file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                original_size = image.size
                image.seek(0)  # animated GIF/WebP/APNG: the first frame
                if target_size and image.format == "JPEG":  # draft works on the stored, not the upright, image
                    stored = tuple(target_size) if image.getexif().get(0x0112, 1) not in (5, 6, 7, 8) \
                        else tuple(target_size[::-1])
                    image.draft("RGB" if image.mode != "L" else "L", stored)
                image = ImageOps.exif_transpose(image)
                image.load()
                return normalize_mode(image), original_size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(
            f"{name}: refused, the image claims more than {MAX_PIXELS // 1_000_000} million pixels "
            "(a possible decompression bomb)") from None
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image file Pillow can read (PNG, JPEG, GIF, BMP, WebP, TIFF ...)") from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as error:
        reason = "truncated or corrupt" if "truncat" in str(error).lower() else f"corrupt ({error})"
        raise ImageError(f"{name}: the image data is {reason}") from None


def list_images(paths):
    """Files as given, folders expanded (sorted, image extensions only, not recursive into hidden dirs)."""
    files = []
    for path in paths:
        path = os.fspath(path)
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                files += [os.path.join(root, n) for n in sorted(names)  # not macOS's ._x.jpg resource forks
                          if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS and not n.startswith(".")]
        elif os.path.lexists(path):  # a broken symlink too: classify reports it with the other failures
            files.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return files

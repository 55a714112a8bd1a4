// The model's input as `vit-keras classify` (apps/images.py, apps/classifier.py) and training (vit_keras/data.py)
// make it with Pillow: a JPEG decoded at reduced scale (draft), then Image.resize(size, BILINEAR, reducing_gap=3).
// MediaPipe's own resize is bilinear without antialiasing: from a large image it would give the model other pixels
// than it was trained on. The arithmetic is Pillow's (libImaging/Resample.c and Reduce.c: 8-bit passes, fixed
// point), so for one decoded image the page and Pillow give the same bytes.
// Pixels are {data: RGBA bytes, width, height}, as in an ImageData; alpha is taken as opaque.

const PRECISION_BITS = 22;  // Pillow's fixed point for 8-bit bands: 32 - 8 - 2
const REDUCING_GAP = 3;  // as the app and training call Image.resize
const JPEG_SCALES = [8, 4, 2];  // the reduced scales a JPEG decoder offers (1/8, 1/4, 1/2)

/** Pillow's Image.reduce((fx, fy)): the mean of each fx × fy block, those of the last column and row over the
 * pixels there are, rounded in Pillow's fixed point. */
function blockMeans(pixels, fx, fy) {
  const {data, width, height} = pixels;
  const outWidth = Math.ceil(width / fx);
  const outHeight = Math.ceil(height / fy);
  const out = new Uint8ClampedArray(outWidth * outHeight * 4).fill(255);
  for (let by = 0; by < outHeight; by++) {
    const top = by * fy;
    const bottom = Math.min(height, top + fy);
    for (let bx = 0; bx < outWidth; bx++) {
      const left = bx * fx;
      const right = Math.min(width, left + fx);
      const count = (right - left) * (bottom - top);
      const multiplier = Math.trunc(Math.fround(2 ** 32 / (256 * count)));  // a C float division in Pillow
      let r = Math.trunc(count / 2);
      let g = r;
      let b = r;
      for (let y = top; y < bottom; y++) {
        for (let i = (y * width + left) * 4; i < (y * width + right) * 4; i += 4) {
          r += data[i];
          g += data[i + 1];
          b += data[i + 2];
        }
      }
      const at = (by * outWidth + bx) * 4;
      out[at] = Math.floor((r * multiplier) / 2 ** 24);
      out[at + 1] = Math.floor((g * multiplier) / 2 ** 24);
      out[at + 2] = Math.floor((b * multiplier) / 2 ** 24);
    }
  }
  return {data: out, width: outWidth, height: outHeight};
}

/** For each output pixel of one axis: the first input pixel and the fixed-point weights of Pillow's bilinear
 * (triangle) filter, whose support widens with the downscale factor: that is the antialiasing. ``extent`` is how
 * many input pixels the output spans, fractional after a reduce. */
function triangleWeights(inSize, extent, outSize) {
  const scale = extent / outSize;
  const filterScale = Math.max(scale, 1);
  const inverse = 1 / filterScale;
  return Array.from({length: outSize}, (_, i) => {
    const centre = (i + 0.5) * scale;
    const first = Math.max(0, Math.trunc(centre - filterScale + 0.5));
    const end = Math.min(inSize, Math.trunc(centre + filterScale + 0.5));
    const weights = [];
    for (let j = first; j < end; j++) weights.push(Math.max(0, 1 - Math.abs((j - centre + 0.5) * inverse)));
    const total = weights.reduce((a, b) => a + b, 0);
    const fixed = weights.map((w) => Math.trunc(0.5 + (total ? w / total : 0) * 2 ** PRECISION_BITS));
    return {first, weights: Int32Array.from(fixed)};
  });
}

/** One of Pillow's two passes, along x (``alongX``) or y, rounded to 8 bits as Pillow rounds each pass. */
function resamplePass(pixels, taps, alongX) {
  const {data, width, height} = pixels;
  const outWidth = alongX ? taps.length : width;
  const outHeight = alongX ? height : taps.length;
  const out = new Uint8ClampedArray(outWidth * outHeight * 4).fill(255);
  const step = alongX ? 4 : width * 4;
  for (let y = 0; y < outHeight; y++) {
    for (let x = 0; x < outWidth; x++) {
      const {first, weights} = taps[alongX ? x : y];
      let r = 2 ** (PRECISION_BITS - 1);
      let g = r;
      let b = r;
      for (let k = 0, i = alongX ? (y * width + first) * 4 : (first * width + x) * 4; k < weights.length;
        k++, i += step) {
        r += data[i] * weights[k];
        g += data[i + 1] * weights[k];
        b += data[i + 2] * weights[k];
      }
      const at = (y * outWidth + x) * 4;  // the array clamps to 0-255
      out[at] = Math.floor(r / 2 ** PRECISION_BITS);
      out[at + 1] = Math.floor(g / 2 ** PRECISION_BITS);
      out[at + 2] = Math.floor(b / 2 ** PRECISION_BITS);
    }
  }
  return {data: out, width: outWidth, height: outHeight};
}

/** Pillow's image.resize((width, height), Image.BILINEAR, reducing_gap=3.0) as an ImageData: block means down to
 * at least 3× the size, then the triangle filter, horizontal pass first. */
export function resizeAsPillow(pixels, width, height) {
  if (pixels.width !== width || pixels.height !== height) {
    const fx = Math.max(1, Math.trunc(pixels.width / width / REDUCING_GAP));
    const fy = Math.max(1, Math.trunc(pixels.height / height / REDUCING_GAP));
    const reduced = fx > 1 || fy > 1 ? blockMeans(pixels, fx, fy) : pixels;
    // What the reduced image spans of the original, as Pillow passes it on: a C float.
    const extentX = Math.fround(pixels.width / fx);
    const extentY = Math.fround(pixels.height / fy);
    const across = resamplePass(reduced, triangleWeights(reduced.width, extentX, width), true);
    pixels = resamplePass(across, triangleWeights(reduced.height, extentY, height), false);
  }
  return pixels instanceof ImageData ? pixels : new ImageData(pixels.data, width, height);
}

/** What the app decodes of a JPEG for a model of ``width`` × ``height`` (Pillow's draft): 1/8, 1/4 or 1/2 scale,
 * the smallest that keeps the image at least that size. The browser decodes at full size, so the page takes the
 * mean of each block, which is what a decoder's 1/8-scale output is (the DCT's DC term) and close to it at 1/4 and
 * 1/2; the two differ by the decoders' rounding and chroma upsampling. */
export function jpegDraft(pixels, width, height) {
  const fits = Math.min(Math.floor(pixels.width / width), Math.floor(pixels.height / height));
  const scale = JPEG_SCALES.find((s) => fits >= s);
  return scale ? blockMeans(pixels, scale, scale) : pixels;
}

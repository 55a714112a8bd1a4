// The page written by `vit-keras export-web`: the model runs here, in the visitor's browser, on MediaPipe's
// ImageClassifier, which reads the labels and the input normalization from the .tflite's own metadata. The page
// resizes each image to the model's input itself, as the app and training do (resize.js), before MediaPipe sees it.
// After each result: document.body.dataset.top1 and window.lastResult = {labels, scores, ms, source}; after each
// file or frame, result or refusal, document.body.dataset.done counts up (for tests and automation).
import {ImageClassifier} from "./mediapipe/vision_bundle.mjs";
import {jpegDraft, resizeAsPillow} from "./resize.js";

const app = document.getElementById("app");
const TOP_K = Number(app.dataset.topK);
const MAX_PIXELS = Number(app.dataset.maxPixels);  // the Python app's decompression-bomb limit
const MAX_BYTES = Number(app.dataset.maxMegabytes) * 2 ** 20;
const INPUT_WIDTH = Number(app.dataset.inputWidth);  // the model's input, from its metadata
const INPUT_HEIGHT = Number(app.dataset.inputHeight);
const LARGE_SIDE = 4096;  // an image with a longer side is scaled down while it is decoded...
const SCALED_SIDE = 1024;  // ...to this: the model sees a few hundred pixels anyway
const CAMERA_INTERVAL_MS = 100;

const element = (id) => document.getElementById(id);
let classifier = null;
let queue = null;  // one file at a time, in the order given, after the model has loaded
let handled = 0;
const frameCanvas = document.createElement("canvas");  // a camera frame, read back as pixels

/** An input this page will not classify, with a message meant for the person who gave it. */
class InputError extends Error {}

const u16be = (b, i) => (b[i] << 8) | b[i + 1];
const u32be = (b, i) => ((b[i] << 24) >>> 0) + (b[i + 1] << 16) + (b[i + 2] << 8) + b[i + 3];
const u16le = (b, i) => b[i] | (b[i + 1] << 8);
const u24le = (b, i) => b[i] | (b[i + 1] << 8) | (b[i + 2] << 16);
const i32le = (b, i) => b[i] | (b[i + 1] << 8) | (b[i + 2] << 16) | (b[i + 3] << 24);
const ascii = (b, i, n) => String.fromCharCode(...b.subarray(i, i + n));

function jpegSize(b) {
  // Walk the marker segments to the first start-of-frame (SOF0-15, less DHT, JPG and DAC).
  for (let i = 2; i + 9 < b.length;) {
    if (b[i] !== 0xff) break;
    const marker = b[i + 1];
    if (marker === 0xff) { i += 1; continue; }
    if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd9)) { i += 2; continue; }
    if (marker >= 0xc0 && marker <= 0xcf && ![0xc4, 0xc8, 0xcc].includes(marker)) {
      return {format: "JPEG", width: u16be(b, i + 7), height: u16be(b, i + 5)};
    }
    i += 2 + u16be(b, i + 2);
  }
  return {format: "JPEG", width: 0, height: 0};  // no frame header: the decoder will say it is corrupt
}

function webpSize(b) {
  const chunk = ascii(b, 12, 4);
  if (chunk === "VP8 ") return {format: "WebP", width: u16le(b, 26) & 0x3fff, height: u16le(b, 28) & 0x3fff};
  if (chunk === "VP8L") {
    const bits = ((b[21] | (b[22] << 8) | (b[23] << 16) | (b[24] << 24)) >>> 0);
    return {format: "WebP", width: (bits & 0x3fff) + 1, height: ((bits >>> 14) & 0x3fff) + 1};
  }
  if (chunk === "VP8X") return {format: "WebP", width: u24le(b, 24) + 1, height: u24le(b, 27) + 1};
  return {format: "WebP", width: 0, height: 0};
}

/** {format, width, height} from the file's first bytes, or null for anything but PNG, JPEG, GIF, WebP, BMP. */
function imageHeader(b) {
  if (b.length >= 24 && b[0] === 0x89 && ascii(b, 1, 3) === "PNG") {
    return {format: "PNG", width: u32be(b, 16), height: u32be(b, 20)};
  }
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return jpegSize(b);
  if (b.length >= 10 && ascii(b, 0, 4) === "GIF8") return {format: "GIF", width: u16le(b, 6), height: u16le(b, 8)};
  if (b.length >= 30 && ascii(b, 0, 4) === "RIFF" && ascii(b, 8, 4) === "WEBP") return webpSize(b);
  if (b.length >= 26 && ascii(b, 0, 2) === "BM") {
    const core = u16le(b, 14) === 12;  // the old OS/2 header has 16-bit sizes
    return {format: "BMP", width: core ? u16le(b, 18) : Math.abs(i32le(b, 18)),
            height: core ? u16le(b, 20) : Math.abs(i32le(b, 22))};
  }
  return null;
}

const megabytes = (bytes) => (bytes / 2 ** 20).toFixed(1);

/** The file as {bitmap: an ImageBitmap, format, note}, refused before decoding when it is no image or claims
 * too many pixels. */
async function decode(file) {
  if (file.size === 0) throw new InputError("the file is empty (0 bytes)");
  if (file.size > MAX_BYTES) {
    throw new InputError(`the file is too large (${megabytes(file.size)} MB; this page reads up to ` +
                         `${megabytes(MAX_BYTES)} MB)`);
  }
  const bytes = new Uint8Array(await file.arrayBuffer());
  const header = imageHeader(bytes);
  if (!header) throw new InputError("not an image file this page can read (PNG, JPEG, GIF, WebP or BMP)");
  const {format, width, height} = header;
  if (width * height > MAX_PIXELS) {
    throw new InputError(`refused as a possible decompression bomb: its header claims ${width} × ${height} pixels ` +
                         `(${(width * height / 1e6).toFixed(0)} MP; the limit is ${MAX_PIXELS / 1e6} MP)`);
  }
  // As Pillow reads it in the Python app: no colour-profile conversion, EXIF orientation applied.
  const options = {colorSpaceConversion: "none", imageOrientation: "from-image"};
  const longSide = Math.max(width, height);
  if (longSide > LARGE_SIDE) {
    Object.assign(options, width >= height ? {resizeWidth: SCALED_SIDE} : {resizeHeight: SCALED_SIDE},
                  {resizeQuality: "high"});
  }
  let bitmap;
  try {
    bitmap = await createImageBitmap(new Blob([bytes]), options);
  } catch {
    throw new InputError(`the ${format} data is truncated or corrupt: the browser could not decode it`);
  }
  const note = longSide > LARGE_SIDE ? `A large image (${width} × ${height}): scaled down to ` +
                                       `${bitmap.width} × ${bitmap.height} as it was decoded.` : "";
  return {bitmap, format, note};
}

/** Draws the bitmap on the preview canvas over white (transparent pixels are white, as in the Python app). */
function draw(bitmap) {
  const canvas = element("shown");
  canvas.width = bitmap.width;
  canvas.height = bitmap.height;
  canvas.hidden = false;
  const context = canvas.getContext("2d", {willReadFrequently: true});
  context.fillStyle = "#fff";
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(bitmap, 0, 0);
  bitmap.close();
  return canvas;
}

function setMessage(text, kind) {
  const message = element("message");
  message.textContent = text;
  message.className = kind || "";
  message.hidden = !text;
}

function showResult(source, labels, scores, ms) {
  const top = labels.length ? `${labels[0]} (${(100 * scores[0]).toFixed(1)}%)` : "no label";
  element("status").textContent = `${source}: ${top} · ${ms.toFixed(1)} ms in this browser`;
  const list = element("scores");
  list.replaceChildren(...labels.map((label, i) => {
    const item = document.createElement("li");
    const name = document.createElement("span");
    name.textContent = label;
    const bar = document.createElement("meter");
    bar.value = scores[i];
    const value = document.createElement("span");
    value.textContent = `${(100 * scores[i]).toFixed(1)}%`;
    item.append(name, bar, value);
    return item;
  }));
  document.body.dataset.top1 = labels[0] ?? "";
  window.lastResult = {labels, scores, ms, source};
}

function showError(source, text) {
  element("status").textContent = `${source}: not classified`;
  element("scores").replaceChildren();
  element("shown").hidden = true;
  setMessage(`${source}: ${text}`, "error");
}

/** The file's attention output, which MediaPipe returns as a second head ("attention", one category a patch
 * named "patch ROW,COL"), as rows of the patch grid scaled to [0, 1]; null for a file without one. */
function attentionGrid(result) {
  const head = result.classifications.find((h) => h.headName === "attention");
  if (!head || !head.categories.length) return null;
  const cells = head.categories.map((c) => [...c.categoryName.matchAll(/\d+/g)].map(Number).concat(c.score));
  const rows = 1 + Math.max(...cells.map((c) => c[0]));
  const columns = 1 + Math.max(...cells.map((c) => c[1]));
  const grid = Array.from({length: rows}, () => new Array(columns).fill(0));
  for (const [row, column, score] of cells) grid[row][column] = score;
  const low = Math.min(...grid.flat());
  const span = Math.max(...grid.flat()) - low;
  return grid.map((row) => row.map((value) => (span > 0 ? (value - low) / span : 0)));
}

/** Tints each patch of the canvas by its attention: more attended, more opaque and yellower. */
function drawAttention(canvas, grid) {
  const context = canvas.getContext("2d");
  const height = canvas.height / grid.length;
  const width = canvas.width / grid[0].length;
  grid.forEach((row, r) => row.forEach((value, c) => {
    context.fillStyle = `rgba(255, ${Math.round(220 * value)}, 0, ${(0.6 * value).toFixed(3)})`;
    context.fillRect(c * width, r * height, width, height);
  }));
}

/** The model's input from the preview canvas or a video frame: a JPEG at the scale the app decodes it, then
 * resized as Pillow resizes, so that MediaPipe gets an image at the model's size and does not resize it. */
function modelInput(image, format) {
  let canvas = image;
  if (image instanceof HTMLVideoElement) {
    canvas = frameCanvas;
    canvas.width = image.videoWidth;
    canvas.height = image.videoHeight;
    canvas.getContext("2d", {willReadFrequently: true}).drawImage(image, 0, 0);
  }
  const pixels = canvas.getContext("2d", {willReadFrequently: true}).getImageData(0, 0, canvas.width, canvas.height);
  return resizeAsPillow(format === "JPEG" ? jpegDraft(pixels, INPUT_WIDTH, INPUT_HEIGHT) : pixels,
                        INPUT_WIDTH, INPUT_HEIGHT);
}

/** Classifies the image (the preview canvas or the video), its resizing counted in the time shown. */
function classify(image, source, format) {
  const start = performance.now();
  const result = classifier.classify(modelInput(image, format));
  const ms = performance.now() - start;
  const categories = (result.classifications[0]?.categories ?? []).slice(0, TOP_K);
  showResult(source, categories.map((c) => c.displayName || c.categoryName), categories.map((c) => c.score), ms);
  const attention = attentionGrid(result);
  if (attention && image instanceof HTMLCanvasElement) drawAttention(image, attention);  // after classifying it
  window.lastResult.attention = attention;
}

function finished() {
  handled += 1;
  document.body.dataset.done = String(handled);
}

async function classifyFile(file) {
  try {
    if (!classifier) throw new InputError("the model is not loaded (see above)");
    const {bitmap, format, note} = await decode(file);
    classify(draw(bitmap), file.name, format);
    setMessage(note, "note");
  } catch (error) {
    showError(file.name, error instanceof InputError ? error.message :
              `could not classify it (${error.name}: ${error.message})`);
  } finally {
    finished();
  }
}

function classifyFiles(files) {
  for (const file of files) queue = queue.then(() => classifyFile(file));
}

async function startCamera(button) {
  const video = element("video");
  if (video.srcObject) {
    video.srcObject.getTracks().forEach((track) => track.stop());
    video.srcObject = null;
    video.hidden = true;
    button.textContent = "Use the camera";
    return;
  }
  try {
    video.srcObject = await navigator.mediaDevices.getUserMedia({video: {facingMode: "environment"}, audio: false});
    await video.play();
  } catch (error) {
    video.srcObject = null;
    setMessage(`The camera is not available: ${error.message || error.name}.`, "error");
    return;
  }
  video.hidden = false;
  element("shown").hidden = true;
  setMessage("");
  button.textContent = "Stop the camera";
  while (video.srcObject) {
    if (video.readyState >= HTMLMediaElement.HAVE_CURRENT_DATA && classifier) {
      classify(video, "camera", "video");
      finished();
    }
    await new Promise((resolve) => setTimeout(resolve, CAMERA_INTERVAL_MS));
  }
}

function wireInputs() {
  const input = element("file");
  input.addEventListener("change", () => {
    classifyFiles([...input.files]);
    input.value = "";  // choosing the same file again still classifies it
  });
  // The whole page takes a drop, so a file that misses the zone is not opened by the browser instead.
  const drop = element("drop");
  document.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  document.addEventListener("dragleave", () => drop.classList.remove("over"));
  document.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    classifyFiles([...event.dataTransfer.files]);
  });
  // getUserMedia exists only in a secure context: https, or this machine (localhost, 127.0.0.1).
  const camera = element("camera");
  if (window.isSecureContext && navigator.mediaDevices?.getUserMedia) {
    camera.hidden = false;
    camera.addEventListener("click", () => startCamera(camera));
  }
}

async function start() {
  wireInputs();
  const wasm = new URL("mediapipe/wasm/", document.baseURI).href;
  try {
    classifier = await ImageClassifier.createFromOptions(
      {wasmLoaderPath: wasm + "vision_wasm_internal.js", wasmBinaryPath: wasm + "vision_wasm_internal.wasm"},
      // Every category: maxResults applies to each head, and the attention head needs all its patches.
      {baseOptions: {modelAssetPath: app.dataset.model, delegate: "CPU"}, maxResults: -1, runningMode: "IMAGE"});
  } catch (error) {
    element("status").textContent = "The model could not be loaded.";
    setMessage(`${error.message || error}`, "error");
    document.body.dataset.state = "failed";
    return;
  }
  element("status").textContent = "Ready: drop an image, choose a file or use the camera.";
  document.body.dataset.state = "ready";
  window.addEventListener("pagehide", () => classifier.close());
  window.addEventListener("pageshow", (event) => { if (event.persisted) location.reload(); });  // closed above
}

queue = start();

/**
 * Bytes as base64 and back on any runtime: Node's `Buffer` where it exists (much the faster for
 * large values), else the `btoa`/`atob` every runtime with `fetch` has.
 */

type BufferLike = Uint8Array & { toString(encoding: 'base64'): string };
const NodeBuffer = (globalThis as { Buffer?: { from(data: Uint8Array | string, encoding?: 'base64'): BufferLike } }).Buffer;

/** Bytes per `String.fromCharCode` call: arguments beyond the engine's limit would throw. */
const CHARS_PER_CALL = 0x8000;

export function base64Of(bytes: Uint8Array): string {
  if (NodeBuffer !== undefined) return NodeBuffer.from(bytes).toString('base64');
  let binary = '';
  for (let i = 0; i < bytes.length; i += CHARS_PER_CALL) {
    binary += String.fromCharCode(...bytes.subarray(i, i + CHARS_PER_CALL));
  }
  return btoa(binary);
}

export function bytesOf(base64: string): Uint8Array {
  if (NodeBuffer !== undefined) return new Uint8Array(NodeBuffer.from(base64, 'base64'));
  const binary = atob(base64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

export function concatBytes(parts: Uint8Array[]): Uint8Array {
  const joined = new Uint8Array(parts.reduce((sum, part) => sum + part.length, 0));
  let at = 0;
  for (const part of parts) {
    joined.set(part, at);
    at += part.length;
  }
  return joined;
}

/** Whether `bytes` begins with the first `length` bytes of `prefix`. */
export function samePrefix(bytes: Uint8Array, prefix: Uint8Array, length: number): boolean {
  if (bytes.length < length || prefix.length < length) return false;
  for (let i = 0; i < length; i++) if (bytes[i] !== prefix[i]) return false;
  return true;
}

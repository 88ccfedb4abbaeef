/**
 * Checks parameter sets the way rlfleet/policies/_params.py does, so a Node
 * worker refuses exactly what a Python worker refuses, with the same kind
 * of message: every name, shape and value is checked before anything
 * changes.
 *
 * @module
 */
import { PolicyError } from '../errors.js';
import { isTensor, numericValues } from '../tensor.js';

/** dtypes numpy calls real numbers (kinds i, u, f): bool is not one. */
const REAL_DTYPES = new Set([
  'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64', 'float16', 'float32', 'float64',
]);

/**
 * Python's tuple notation of a shape, as the Python worker's messages print it.
 *
 * @param {readonly number[]} shape
 * @returns {string}
 */
export function shapeText(shape) {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
}

/**
 * Validates a parameter set and casts it to float32.
 *
 * @param {Record<string, unknown>} params Name -> tensor.
 * @param {ReadonlyMap<string, number[]>} shapes Expected name -> shape, in canonical order.
 * @param {string} owner The policy class name, for messages.
 * @returns {Map<string, Float32Array>} New float32 arrays, in `shapes` order.
 * @throws {PolicyError} Naming missing/unexpected names, a wrong shape or
 *   dtype, or the first non-finite value.
 */
export function checkedParams(params, shapes, owner) {
  const missing = [...shapes.keys()].filter((name) => !Object.hasOwn(params, name));
  const unexpected = Object.keys(params)
    .filter((name) => !shapes.has(name))
    .sort();
  if (missing.length > 0 || unexpected.length > 0) {
    throw new PolicyError(
      `${owner}.set_param_values: missing parameters ${pyList(missing)}, unexpected ` +
        `parameters ${pyList(unexpected)}; expected exactly ${pyList([...shapes.keys()])} ` +
        '(see get_param_values() for names and shapes)',
    );
  }
  /** @type {Map<string, Float32Array>} */
  const checked = new Map();
  for (const [name, shape] of shapes) {
    checked.set(name, checkedValue(name, params[name], shape, owner));
  }
  return checked;
}

/**
 * @param {string} name
 * @param {unknown} value
 * @param {number[]} shape
 * @param {string} owner
 * @returns {Float32Array}
 */
function checkedValue(name, value, shape, owner) {
  const where = `${owner}.set_param_values: parameter '${name}'`;
  if (!isTensor(value)) {
    throw new PolicyError(`${where} is not an array of numbers (got a nested map)`);
  }
  if (!REAL_DTYPES.has(value.dtype)) {
    throw new PolicyError(`${where} must hold real numbers (int or float), got dtype ${value.dtype}`);
  }
  if (value.shape.length !== shape.length || value.shape.some((dim, i) => dim !== shape[i])) {
    throw new PolicyError(`${where} must have shape ${shapeText(shape)}, got ${shapeText(value.shape)}`);
  }
  const converted = Float32Array.from(numericValues(value));
  const bad = converted.findIndex((x) => !Number.isFinite(x));
  if (bad >= 0) {
    throw new PolicyError(
      `${where} has a non-finite float32 value at index ${shapeText(unravel(bad, shape))} ` +
        `(${numericValues(value)[bad]}); values must be finite and within float32 range`,
    );
  }
  return converted;
}

/**
 * The multi-index of a flat C-order index.
 *
 * @param {number} flat
 * @param {readonly number[]} shape
 * @returns {number[]}
 */
function unravel(flat, shape) {
  const index = new Array(shape.length).fill(0);
  let rest = flat;
  for (let axis = shape.length - 1; axis >= 0; axis -= 1) {
    index[axis] = rest % shape[axis];
    rest = Math.floor(rest / shape[axis]);
  }
  return index;
}

/**
 * @param {string[]} names
 * @returns {string}
 */
function pyList(names) {
  return `[${names.map((name) => `'${name}'`).join(', ')}]`;
}

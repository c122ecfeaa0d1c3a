// What the SDK check scripts share: failures as CheckError, values shown
// short, the SDK's errors named by type and status, and a runner that
// prints "ok - <check>" per check or "FAIL - <check>: <why>" and exits 1 at
// the first failure.
export class CheckError extends Error {}

export function assert(cond, message) {
  if (!cond) throw new CheckError(message);
}

export function show(value) {
  const s = JSON.stringify(value);
  return s.length > 600 ? `${s.slice(0, 600)}...` : s;
}

// `APIError` is the SDK's error base class.
export function errorText(e, APIError) {
  if (e instanceof APIError) return `${e.constructor.name} ${e.status}: ${show(e.error ?? e.message)}`;
  return String(e?.stack ?? e);
}

export class Checks {
  constructor(APIError) {
    this.APIError = APIError;
    this.list = [];
  }

  add(name, fn) {
    this.list.push({ name, fn });
  }

  async run() {
    for (const { name, fn } of this.list) {
      try {
        await fn();
        console.log(`ok - ${name}`);
      } catch (e) {
        console.log(`FAIL - ${name}: ${e instanceof CheckError ? e.message : errorText(e, this.APIError)}`);
        process.exit(1);
      }
    }
    console.log(`PASS: ${this.list.length} checks`);
  }
}

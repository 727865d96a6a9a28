// Reads the settings `cargo xtask ci` (xtask/src/conformance.rs) hands the suite.

/**
 * The value of the environment variable `name`; throws, naming it and how to get it, when it
 * is missing, so a test file run by hand fails with a message instead of reaching a vendor.
 */
export function requireEnv(name) {
  const value = process.env[name];
  if (value === undefined || value === "") {
    throw new Error(
      `${name} is not set. The conformance suite talks only to the local fakes and Vercel's ` +
        "emulator: run it with `cargo xtask ci` (step `conformance`), or start them by hand " +
        "as conformance/README.md shows and export the variables it lists.",
    );
  }
  return value;
}

package recpipe.spark;

/**
 * Dense-feature transforms for Spark's generated code, each one static call in place of a tree
 * of Spark expressions whose generated code is larger (a stage's main loop over 8000 bytes of
 * bytecode is not compiled by HotSpot, and Spark then runs the stage operator by operator).
 */
public final class Dense {
  private Dense() {}

  /**
   * The {@code log} normaliser: {@code cast(signum(x) * log1p(abs(x)) as float)}, computed as
   * Spark computes it ({@code Math.signum}, {@code StrictMath.log1p}, then a narrowing cast):
   * the same float for every double, NaN and infinities included.
   *
   * @param x the filled value
   * @return the normalised value
   */
  public static float signedLog1p(double x) {
    return (float) (Math.signum(x) * StrictMath.log1p(Math.abs(x)));
  }
}

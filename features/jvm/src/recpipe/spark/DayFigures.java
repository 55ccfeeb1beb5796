package recpipe.spark;

import org.apache.spark.sql.catalyst.util.SQLOrderingUtil;

/**
 * A day's figures, gathered a row at a time by {@link DayFiguresTap} and merged across tasks by
 * {@link DayFiguresAccumulator}.
 *
 * <p>The same values as these Spark aggregates, each over the rows whose {@code bad} flag is
 * false (good rows), except the first two: {@code count(1)}, {@code sum(cast(bad as long))},
 * {@code avg(cast(label as double))}, per null-counted column {@code c_i}
 * {@code sum(cast(isnull(c_i) as long))} (0 over good rows, null over no rows), and per dense
 * column {@code x_j} {@code count}, {@code sum}, {@code sum(x * x)}, {@code min}, {@code max} of
 * {@code cast(x_j as double)} (min / max order NaN above every number, as Spark's do).
 *
 * <p>{@link #figures} lists them in that order: {@code total}, {@code bad},
 * {@code positive_rate}, {@code null_i}, then {@code count_j}, {@code sum_j}, {@code sumsq_j},
 * {@code min_j}, {@code max_j} for each j.
 */
public final class DayFigures implements java.io.Serializable {
  private static final long serialVersionUID = 1L;

  long total;
  long bad;
  long labelCount;
  double labelSum;
  final long[] nulls;
  final long[] count;
  final double[] sum;
  final double[] sumsq;
  final double[] min;
  final double[] max;

  /**
   * @param nulls how many columns are counted for nulls
   * @param dense how many dense columns have moments
   */
  public DayFigures(int nulls, int dense) {
    this.nulls = new long[nulls];
    this.count = new long[dense];
    this.sum = new double[dense];
    this.sumsq = new double[dense];
    this.min = new double[dense];
    this.max = new double[dense];
  }

  /**
   * Count one row; returns whether it is good (its other figures are then to be added).
   *
   * @param badIsNull the bad flag is null: the row is neither bad nor good, as Spark's sum
   *     and when() treat a null
   */
  public boolean row(boolean badIsNull, boolean isBad) {
    total++;
    if (badIsNull) {
      return false;
    }
    if (isBad) {
      bad++;
      return false;
    }
    return true;
  }

  /** A good row's (non-null) label. */
  public void label(double value) {
    labelCount++;
    labelSum += value;
  }

  /** A good row whose null-counted column i is null. */
  public void isNull(int i) {
    nulls[i]++;
  }

  /** A good row's (non-null) value of dense column j. */
  public void dense(int j, double x) {
    // sums start from 0.0, as Spark's (0.0 + -0.0 is 0.0)
    sum[j] += x;
    sumsq[j] += x * x;
    if (count[j] == 0) {
      min[j] = x;
      max[j] = x;
    } else {
      // replaced only by a strictly smaller / greater value, as Spark's least / greatest
      if (SQLOrderingUtil.compareDoubles(x, min[j]) < 0) {
        min[j] = x;
      }
      if (SQLOrderingUtil.compareDoubles(x, max[j]) > 0) {
        max[j] = x;
      }
    }
    count[j]++;
  }

  /** Add {@code other}'s figures (of the same columns) to these. */
  public void merge(DayFigures other) {
    total += other.total;
    bad += other.bad;
    labelCount += other.labelCount;
    labelSum += other.labelSum;
    for (int i = 0; i < nulls.length; i++) {
      nulls[i] += other.nulls[i];
    }
    for (int j = 0; j < count.length; j++) {
      if (other.count[j] == 0) {
        continue;
      }
      sum[j] += other.sum[j];
      sumsq[j] += other.sumsq[j];
      if (count[j] == 0) {
        min[j] = other.min[j];
        max[j] = other.max[j];
      } else {
        if (SQLOrderingUtil.compareDoubles(other.min[j], min[j]) < 0) {
          min[j] = other.min[j];
        }
        if (SQLOrderingUtil.compareDoubles(other.max[j], max[j]) > 0) {
          max[j] = other.max[j];
        }
      }
      count[j] += other.count[j];
    }
  }

  /**
   * The figures in the order the class comment gives: Long,
   * Double or null each.
   */
  public Object[] figures() {
    int n = nulls.length;
    int m = count.length;
    Object[] out = new Object[3 + n + 5 * m];
    boolean empty = total == 0; // Spark's sum over no rows is null
    out[0] = total;
    out[1] = empty ? null : (Object) bad;
    out[2] = labelCount == 0 ? null : (Object) (labelSum / labelCount);
    for (int i = 0; i < n; i++) {
      out[3 + i] = empty ? null : (Object) nulls[i];
    }
    for (int j = 0; j < m; j++) {
      int k = 3 + n + 5 * j;
      boolean none = count[j] == 0;
      out[k] = count[j];
      out[k + 1] = none ? null : (Object) sum[j];
      out[k + 2] = none ? null : (Object) sumsq[j];
      out[k + 3] = none ? null : (Object) min[j];
      out[k + 4] = none ? null : (Object) max[j];
    }
    return out;
  }
}

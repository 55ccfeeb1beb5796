package recpipe.spark;

import java.util.Arrays;
import java.util.List;
import org.apache.spark.util.AccumulatorV2;

/**
 * A day's figures ({@link DayFigures}) gathered by {@link DayFiguresTap} as the rows
 * stream through a stage, and merged on the driver from each task's copy when the task ends,
 * as Spark's SQL metrics are.
 *
 * <p>A task that fails and is retried adds only its successful attempt's figures; a stage that
 * is computed again (a lost executor) adds its rows again, as {@code DataFrame.observe} does.
 */
public final class DayFiguresAccumulator
    extends AccumulatorV2<DayFigures, DayFigures> {
  private static final long serialVersionUID = 1L;

  private final int nullColumns;
  private final int denseColumns;
  private DayFigures buffer;

  /**
   * @param nullColumns how many columns are counted for nulls
   * @param denseColumns how many dense columns have moments
   */
  public DayFiguresAccumulator(int nullColumns, int denseColumns) {
    this.nullColumns = nullColumns;
    this.denseColumns = denseColumns;
    this.buffer = new DayFigures(nullColumns, denseColumns);
  }

  /** How many columns are counted for nulls. */
  public int nullColumns() {
    return nullColumns;
  }

  /** How many dense columns have moments. */
  public int denseColumns() {
    return denseColumns;
  }

  /** The figures this copy holds, which the generated code updates in place. */
  public DayFigures buffer() {
    return buffer;
  }

  /**
   * The figures as a list in {@link DayFigures#figures}' order (Long, Double or null
   * each): what {@code features.jvm} reads on the driver after the job.
   */
  public List<Object> figures() {
    return Arrays.asList(buffer.figures());
  }

  @Override
  public boolean isZero() {
    return buffer.total == 0;
  }

  @Override
  public AccumulatorV2<DayFigures, DayFigures> copy() {
    DayFiguresAccumulator out = new DayFiguresAccumulator(nullColumns, denseColumns);
    out.buffer.merge(buffer);
    return out;
  }

  @Override
  public void reset() {
    buffer = new DayFigures(nullColumns, denseColumns);
  }

  @Override
  public void add(DayFigures other) {
    buffer.merge(other);
  }

  @Override
  public void merge(AccumulatorV2<DayFigures, DayFigures> other) {
    buffer.merge(((DayFiguresAccumulator) other).buffer);
  }

  @Override
  public DayFigures value() {
    return buffer;
  }
}

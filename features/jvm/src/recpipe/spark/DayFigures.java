package recpipe.spark;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.Cast;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.aggregate.ImperativeAggregate;
import org.apache.spark.sql.catalyst.expressions.aggregate.TypedImperativeAggregate;
import org.apache.spark.sql.catalyst.util.SQLOrderingUtil;
import org.apache.spark.sql.types.BooleanType$;
import org.apache.spark.sql.types.ByteType$;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.DoubleType$;
import org.apache.spark.sql.types.FloatType$;
import org.apache.spark.sql.types.IntegerType$;
import org.apache.spark.sql.types.LongType$;
import org.apache.spark.sql.types.ShortType$;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A day's figures in one aggregate: {@code recpipe_day_figures(n_nulls, bad, label, c_1..c_n,
 * x_1..x_m)}.
 *
 * <p>The same values as these Spark aggregates, each over the rows where {@code bad} is false
 * (good rows), except the first two: {@code count(1)}, {@code sum(cast(bad as long))},
 * {@code avg(cast(label as double))}, per column {@code c_i} {@code sum(cast(isnull(c_i) as
 * long))} (0 over good rows, null over no rows), and per dense column {@code x_j}
 * {@code count}, {@code sum}, {@code sum(x * x)}, {@code min}, {@code max} of
 * {@code cast(x_j as double)} (min / max order NaN above every number, as Spark's do).
 *
 * <p>Why: as {@code DataFrame.observe} metrics, Spark evaluates each aggregate's update
 * expressions row by row outside the stage's generated code, about 0.1 us each; a Criteo day
 * has 94 of them. This one reads the row's columns once, in a loop over primitive arrays.
 *
 * <p>Result: a struct of {@code 3 + n + 5m} fields, in the order above ({@code total},
 * {@code bad}, {@code positive_rate}, {@code null_i}, then {@code count_j}, {@code sum_j},
 * {@code sumsq_j}, {@code min_j}, {@code max_j} for each j).
 */
public final class DayFigures extends TypedImperativeAggregate<DayFigures.Buffer>
    implements java.io.Serializable {
  private static final long serialVersionUID = 1L;

  /** The running figures of one partition (or of several, merged). */
  public static final class Buffer {
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

    Buffer(int nulls, int dense) {
      this.nulls = new long[nulls];
      this.count = new long[dense];
      this.sum = new double[dense];
      this.sumsq = new double[dense];
      this.min = new double[dense];
      this.max = new double[dense];
    }
  }

  private final int nullColumns;
  private final Seq<Expression> columns;
  private final int mutableAggBufferOffset;
  private final int inputAggBufferOffset;
  private final Expression[] exprs;
  private final int[] ordinals; // >= 0: a bound column read directly; -1: evaluate the expression
  private final DataType[] types; // of the column read directly

  /**
   * @param nullColumns n, how many of the columns after {@code bad} and {@code label} are counted
   *     for nulls; the rest are dense
   * @param columns bad (boolean), label (numeric), the n null-counted columns (any type), the
   *     dense columns (numeric)
   */
  public DayFigures(
      int nullColumns, Seq<Expression> columns, int mutableAggBufferOffset, int inputAggBufferOffset) {
    this.nullColumns = nullColumns;
    this.columns = columns;
    this.mutableAggBufferOffset = mutableAggBufferOffset;
    this.inputAggBufferOffset = inputAggBufferOffset;
    List<Expression> list = CollectionConverters.asJava(columns);
    if (nullColumns < 0 || list.size() < 2 + nullColumns) {
      throw new IllegalArgumentException(
          "recpipe_day_figures(n_nulls, bad, label, ...): " + nullColumns + " null-counted columns"
              + " of " + list.size());
    }
    exprs = list.toArray(new Expression[0]);
    ordinals = new int[exprs.length];
    types = new DataType[exprs.length];
    for (int i = 0; i < exprs.length; i++) {
      Expression e = exprs[i];
      // a numeric column cast to double is read as its own type: Spark's cast is Java's widening
      if (i != 0 && e instanceof Cast && e.dataType() == DoubleType$.MODULE$
          && isNumeric(((Cast) e).child().dataType())) {
        e = ((Cast) e).child();
      }
      boolean readable =
          i == 0
              ? e.dataType() == BooleanType$.MODULE$
              : i >= 2 && i < 2 + nullColumns || isNumeric(e.dataType());
      boolean direct = e instanceof BoundReference && readable;
      ordinals[i] = direct ? ((BoundReference) e).ordinal() : -1;
      types[i] = e.dataType();
    }
  }

  private static boolean isNumeric(DataType t) {
    return t == DoubleType$.MODULE$ || t == FloatType$.MODULE$ || t == LongType$.MODULE$
        || t == IntegerType$.MODULE$ || t == ShortType$.MODULE$ || t == ByteType$.MODULE$;
  }

  private int dense() {
    return exprs.length - 2 - nullColumns;
  }

  private boolean isNull(int i, InternalRow row) {
    return ordinals[i] >= 0 ? row.isNullAt(ordinals[i]) : exprs[i].eval(row) == null;
  }

  /** Column i of a row as a double; the caller checked that it is not null. */
  private double number(int i, InternalRow row) {
    int o = ordinals[i];
    if (o < 0) {
      return ((Number) exprs[i].eval(row)).doubleValue();
    }
    DataType t = types[i];
    if (t == DoubleType$.MODULE$) {
      return row.getDouble(o);
    } else if (t == LongType$.MODULE$) {
      return (double) row.getLong(o);
    } else if (t == IntegerType$.MODULE$) {
      return row.getInt(o);
    } else if (t == FloatType$.MODULE$) {
      return row.getFloat(o);
    } else if (t == ShortType$.MODULE$) {
      return row.getShort(o);
    }
    return row.getByte(o);
  }

  @Override
  public Buffer createAggregationBuffer() {
    return new Buffer(nullColumns, dense());
  }

  @Override
  public Buffer update(Buffer b, InternalRow row) {
    b.total++;
    if (isNull(0, row)) {
      return b; // neither bad nor good, as Spark's sum and when() treat a null
    }
    boolean bad = ordinals[0] >= 0 ? row.getBoolean(ordinals[0]) : (Boolean) exprs[0].eval(row);
    if (bad) {
      b.bad++;
      return b;
    }
    if (!isNull(1, row)) {
      b.labelCount++;
      b.labelSum += number(1, row);
    }
    for (int i = 0; i < nullColumns; i++) {
      if (isNull(2 + i, row)) {
        b.nulls[i]++;
      }
    }
    for (int j = 0, i = 2 + nullColumns; i < exprs.length; i++, j++) {
      if (isNull(i, row)) {
        continue;
      }
      double x = number(i, row);
      // sums start from 0.0, as Spark's (0.0 + -0.0 is 0.0)
      b.sum[j] += x;
      b.sumsq[j] += x * x;
      if (b.count[j] == 0) {
        b.min[j] = x;
        b.max[j] = x;
      } else {
        // replaced only by a strictly smaller / greater value, as Spark's least / greatest
        if (SQLOrderingUtil.compareDoubles(x, b.min[j]) < 0) {
          b.min[j] = x;
        }
        if (SQLOrderingUtil.compareDoubles(x, b.max[j]) > 0) {
          b.max[j] = x;
        }
      }
      b.count[j]++;
    }
    return b;
  }

  @Override
  public Buffer merge(Buffer b, Buffer other) {
    b.total += other.total;
    b.bad += other.bad;
    b.labelCount += other.labelCount;
    b.labelSum += other.labelSum;
    for (int i = 0; i < b.nulls.length; i++) {
      b.nulls[i] += other.nulls[i];
    }
    for (int j = 0; j < b.count.length; j++) {
      if (other.count[j] == 0) {
        continue;
      }
      b.sum[j] += other.sum[j];
      b.sumsq[j] += other.sumsq[j];
      if (b.count[j] == 0) {
        b.min[j] = other.min[j];
        b.max[j] = other.max[j];
      } else {
        if (SQLOrderingUtil.compareDoubles(other.min[j], b.min[j]) < 0) {
          b.min[j] = other.min[j];
        }
        if (SQLOrderingUtil.compareDoubles(other.max[j], b.max[j]) > 0) {
          b.max[j] = other.max[j];
        }
      }
      b.count[j] += other.count[j];
    }
    return b;
  }

  @Override
  public Object eval(Buffer b) {
    int n = b.nulls.length;
    int m = b.count.length;
    Object[] out = new Object[3 + n + 5 * m];
    boolean empty = b.total == 0; // Spark's sum over no rows is null
    out[0] = b.total;
    out[1] = empty ? null : (Object) b.bad;
    out[2] = b.labelCount == 0 ? null : (Object) (b.labelSum / b.labelCount);
    for (int i = 0; i < n; i++) {
      out[3 + i] = empty ? null : (Object) b.nulls[i];
    }
    for (int j = 0; j < m; j++) {
      int k = 3 + n + 5 * j;
      boolean none = b.count[j] == 0;
      out[k] = b.count[j];
      out[k + 1] = none ? null : (Object) b.sum[j];
      out[k + 2] = none ? null : (Object) b.sumsq[j];
      out[k + 3] = none ? null : (Object) b.min[j];
      out[k + 4] = none ? null : (Object) b.max[j];
    }
    return new GenericInternalRow(out);
  }

  @Override
  public byte[] serialize(Buffer b) {
    int n = b.nulls.length;
    int m = b.count.length;
    ByteBuffer out = ByteBuffer.allocate(8 * (4 + n + 5 * m));
    out.putLong(b.total).putLong(b.bad).putLong(b.labelCount).putDouble(b.labelSum);
    for (long v : b.nulls) {
      out.putLong(v);
    }
    for (int j = 0; j < m; j++) {
      out.putLong(b.count[j]).putDouble(b.sum[j]).putDouble(b.sumsq[j]);
      out.putDouble(b.min[j]).putDouble(b.max[j]);
    }
    return out.array();
  }

  @Override
  public Buffer deserialize(byte[] bytes) {
    ByteBuffer in = ByteBuffer.wrap(bytes);
    Buffer b = createAggregationBuffer();
    b.total = in.getLong();
    b.bad = in.getLong();
    b.labelCount = in.getLong();
    b.labelSum = in.getDouble();
    for (int i = 0; i < b.nulls.length; i++) {
      b.nulls[i] = in.getLong();
    }
    for (int j = 0; j < b.count.length; j++) {
      b.count[j] = in.getLong();
      b.sum[j] = in.getDouble();
      b.sumsq[j] = in.getDouble();
      b.min[j] = in.getDouble();
      b.max[j] = in.getDouble();
    }
    return b;
  }

  @Override
  public DataType dataType() {
    List<StructField> fields = new ArrayList<>();
    fields.add(DataTypes.createStructField("total", DataTypes.LongType, false));
    fields.add(DataTypes.createStructField("bad", DataTypes.LongType, true));
    fields.add(DataTypes.createStructField("positive_rate", DataTypes.DoubleType, true));
    for (int i = 0; i < nullColumns; i++) {
      fields.add(DataTypes.createStructField("null_" + i, DataTypes.LongType, true));
    }
    for (int j = 0; j < dense(); j++) {
      fields.add(DataTypes.createStructField("count_" + j, DataTypes.LongType, false));
      for (String m : new String[] {"sum_", "sumsq_", "min_", "max_"}) {
        fields.add(DataTypes.createStructField(m + j, DataTypes.DoubleType, true));
      }
    }
    return DataTypes.createStructType(fields);
  }

  @Override
  public boolean nullable() {
    return false;
  }

  @Override
  public Seq<Expression> children() {
    return columns;
  }

  @Override
  public int mutableAggBufferOffset() {
    return mutableAggBufferOffset;
  }

  @Override
  public int inputAggBufferOffset() {
    return inputAggBufferOffset;
  }

  @Override
  public ImperativeAggregate withNewMutableAggBufferOffset(int offset) {
    return new DayFigures(nullColumns, columns, offset, inputAggBufferOffset);
  }

  @Override
  public ImperativeAggregate withNewInputAggBufferOffset(int offset) {
    return new DayFigures(nullColumns, columns, mutableAggBufferOffset, offset);
  }

  @Override
  public Expression withNewChildrenInternal(IndexedSeq<Expression> newChildren) {
    return new DayFigures(nullColumns, newChildren, mutableAggBufferOffset, inputAggBufferOffset);
  }

  @Override
  public String prettyName() {
    return "recpipe_day_figures";
  }

  @Override
  public int productArity() {
    return 4;
  }

  @Override
  public Object productElement(int n) {
    switch (n) {
      case 0:
        return nullColumns;
      case 1:
        return columns;
      case 2:
        return mutableAggBufferOffset;
      case 3:
        return inputAggBufferOffset;
      default:
        throw new IndexOutOfBoundsException(String.valueOf(n));
    }
  }

  @Override
  public boolean canEqual(Object other) {
    return other instanceof DayFigures;
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof DayFigures
        && ((DayFigures) other).nullColumns == nullColumns
        && ((DayFigures) other).columns.equals(columns)
        && ((DayFigures) other).mutableAggBufferOffset == mutableAggBufferOffset
        && ((DayFigures) other).inputAggBufferOffset == inputAggBufferOffset;
  }

  @Override
  public int hashCode() {
    return java.util.Objects.hash(nullColumns, columns, mutableAggBufferOffset, inputAggBufferOffset);
  }
}

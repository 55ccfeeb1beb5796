package recpipe.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeBlock;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprValue;
import org.apache.spark.sql.catalyst.expressions.codegen.JavaCode;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code recpipe_day_figures_tap(accumulator_id, n_nulls, bad, label, c_1..c_n, x_1..x_m)}:
 * returns {@code bad} and adds the row to a {@link DayFiguresAccumulator}: the figures
 * {@link DayFigures} lists, of those columns.
 *
 * <p>Why: an observed metric ({@code DataFrame.observe}) is a plan node of its own, which ends
 * the stage's generated code: every row is copied into Spark's {@code UnsafeRow} there (about
 * 0.9 s of a 1M-row Criteo day). This is an expression, compiled into the stage as one call
 * per row, so parse, quarantine filter and features stay one stage.
 *
 * <p>It is not deterministic (it has an effect), so Spark neither pushes a filter on its
 * result below it nor evaluates it lazily: each row the stage reads is added once.
 */
public final class DayFiguresTap extends Expression implements java.io.Serializable {
  private static final long serialVersionUID = 1L;

  private final DayFiguresAccumulator accumulator;
  private final int nullColumns;
  private final Seq<Expression> columns;
  private final Expression[] exprs;

  /**
   * @param accumulator where the figures go (registered with the SparkContext)
   * @param nullColumns n, how many of the columns after {@code bad} and {@code label} are
   *     counted for nulls; the rest are dense
   * @param columns bad (boolean), label (numeric), the n null-counted columns (any type), the
   *     dense columns (numeric), as many as the accumulator was made for
   * @throws IllegalArgumentException the columns do not match the accumulator's
   */
  public DayFiguresTap(
      DayFiguresAccumulator accumulator, int nullColumns, Seq<Expression> columns) {
    this.accumulator = accumulator;
    this.nullColumns = nullColumns;
    this.columns = columns;
    exprs = CollectionConverters.asJava(columns).toArray(new Expression[0]);
    if (nullColumns != accumulator.nullColumns()
        || exprs.length != 2 + nullColumns + accumulator.denseColumns()) {
      throw new IllegalArgumentException(
          Extensions.DAY_FIGURES_TAP + ": " + exprs.length + " columns with n_nulls=" + nullColumns
              + " for an accumulator of " + accumulator.nullColumns() + " null-counted and "
              + accumulator.denseColumns() + " dense columns");
    }
  }

  @Override
  public boolean deterministic() {
    return false;
  }

  @Override
  public boolean nullable() {
    return exprs[0].nullable();
  }

  @Override
  public DataType dataType() {
    return DataTypes.BooleanType;
  }

  @Override
  public Seq<Expression> children() {
    return columns;
  }

  @Override
  public Object eval(InternalRow row) {
    Object bad = exprs[0].eval(row);
    DayFigures b = accumulator.buffer();
    if (!b.row(bad == null, bad != null && (Boolean) bad)) {
      return bad;
    }
    Object label = exprs[1].eval(row);
    if (label != null) {
      b.label(((Number) label).doubleValue());
    }
    for (int i = 0; i < nullColumns; i++) {
      if (exprs[2 + i].eval(row) == null) {
        b.isNull(i);
      }
    }
    for (int j = 0, i = 2 + nullColumns; i < exprs.length; i++, j++) {
      Object x = exprs[i].eval(row);
      if (x != null) {
        b.dense(j, ((Number) x).doubleValue());
      }
    }
    return bad;
  }

  /**
   * The children's code, then one call of a method that updates the accumulator's buffer (its
   * body stays out of the stage's main loop, whose size decides whether HotSpot compiles it).
   */
  @Override
  public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
    String acc =
        ctx.addReferenceObj("dayFigures", accumulator, DayFiguresAccumulator.class.getName());
    StringBuilder code = new StringBuilder();
    ExprCode[] evs = new ExprCode[exprs.length];
    for (int i = 0; i < exprs.length; i++) {
      evs[i] = exprs[i].genCode(ctx);
      code.append(evs[i].code().toString()).append('\n');
    }
    // (parameter declaration, argument) per value the update reads
    List<String> params = new ArrayList<>();
    List<ExprValue> args = new ArrayList<>();
    params.add("boolean badIsNull");
    args.add(evs[0].isNull());
    params.add("boolean isBad");
    args.add(evs[0].value());
    params.add("boolean labelIsNull");
    args.add(evs[1].isNull());
    params.add(CodeGenerator.javaType(exprs[1].dataType()) + " label");
    args.add(evs[1].value());
    StringBuilder body = new StringBuilder();
    body.append("recpipe.spark.DayFigures b = ").append(acc).append(".buffer();\n");
    body.append("if (!b.row(badIsNull, isBad)) return;\n");
    body.append("if (!labelIsNull) b.label((double) label);\n");
    for (int i = 0; i < nullColumns; i++) {
      params.add("boolean c" + i);
      args.add(evs[2 + i].isNull());
      body.append("if (c").append(i).append(") b.isNull(").append(i).append(");\n");
    }
    for (int j = 0, i = 2 + nullColumns; i < exprs.length; i++, j++) {
      params.add("boolean xIsNull" + j);
      args.add(evs[i].isNull());
      params.add(CodeGenerator.javaType(exprs[i].dataType()) + " x" + j);
      args.add(evs[i].value());
      body.append("if (!xIsNull").append(j).append(") b.dense(").append(j);
      body.append(", (double) x").append(j).append(");\n");
    }
    int slots = CodeGenerator.calculateParamLengthFromExprValues(
        CollectionConverters.asScala(args).toList());
    List<String> argText = new ArrayList<>();
    for (ExprValue arg : args) {
      argText.add(arg.toString());
    }
    if (CodeGenerator.isValidParamLength(slots)) {
      String name = ctx.freshName("dayFiguresTap");
      String function =
          "private void " + name + "(" + String.join(", ", params) + ") {\n" + body + "}\n";
      String call = ctx.addNewFunction(name, function, false);
      code.append(call).append('(').append(String.join(", ", argText)).append(");\n");
    } else { // too many columns for one method's parameters: inline, with the values bound
      code.append("do {\n");
      for (int k = 0; k < params.size(); k++) {
        code.append(params.get(k)).append(" = ").append(argText.get(k)).append(";\n");
      }
      code.append(body.toString().replace("return;", "break;")).append("} while (false);\n");
    }
    code.append("boolean ").append(ev.isNull()).append(" = ").append(evs[0].isNull()).append(";\n");
    code.append("boolean ").append(ev.value()).append(" = ").append(evs[0].value()).append(";\n");
    List<String> parts = List.of(code.toString());
    return new ExprCode(
        new CodeBlock(
            CollectionConverters.asScala(parts).toList(),
            CollectionConverters.asScala(new ArrayList<JavaCode>()).toList()),
        JavaCode.isNullVariable(ev.isNull().toString()),
        JavaCode.variable(ev.value().toString(), DataTypes.BooleanType));
  }

  @Override
  public Expression withNewChildrenInternal(IndexedSeq<Expression> newChildren) {
    return new DayFiguresTap(accumulator, nullColumns, newChildren);
  }

  @Override
  public String prettyName() {
    return Extensions.DAY_FIGURES_TAP;
  }

  @Override
  public int productArity() {
    return 3;
  }

  @Override
  public Object productElement(int n) {
    switch (n) {
      case 0:
        return accumulator;
      case 1:
        return nullColumns;
      case 2:
        return columns;
      default:
        throw new IndexOutOfBoundsException(String.valueOf(n));
    }
  }

  @Override
  public boolean canEqual(Object other) {
    return other instanceof DayFiguresTap;
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof DayFiguresTap
        && ((DayFiguresTap) other).accumulator == accumulator
        && ((DayFiguresTap) other).columns.equals(columns);
  }

  @Override
  public int hashCode() {
    return Objects.hash(System.identityHashCode(accumulator), columns);
  }
}

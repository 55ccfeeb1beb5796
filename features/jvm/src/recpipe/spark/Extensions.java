package recpipe.spark;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.util.AccumulatorContext;
import org.apache.spark.util.AccumulatorV2;
import scala.Function1;
import scala.Option;
import scala.Tuple3;
import scala.collection.immutable.Seq;
import scala.runtime.BoxedUnit;

/**
 * recpipe's SQL functions, registered by {@code spark.sql.extensions=recpipe.spark.Extensions}.
 *
 * <p>{@code recpipe_trim_whitespace(string)}: {@link Ids#trimWhitespace}, and
 * {@code recpipe_signed_log1p(double)}: {@link Dense#signedLog1p}, each compiled into the stage's
 * generated code as a static call (Spark's {@code StaticInvoke}); null stays null.
 * {@code recpipe_day_figures_tap(...)}: {@link DayFiguresTap}.
 */
public final class Extensions implements Function1<SparkSessionExtensions, BoxedUnit> {
  /** The SQL name of {@link Ids#trimWhitespace}. */
  public static final String TRIM_WHITESPACE = "recpipe_trim_whitespace";

  /** The SQL name of {@link DayFiguresTap}. */
  public static final String DAY_FIGURES_TAP = "recpipe_day_figures_tap";

  /** The SQL name of {@link Dense#signedLog1p}. */
  public static final String SIGNED_LOG1P = "recpipe_signed_log1p";

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    inject(
        extensions,
        TRIM_WHITESPACE,
        Ids.class,
        "(str) - str without ' ', tab, CR, LF and form feed at either end.",
        Extensions::trimWhitespace);
    inject(
        extensions,
        DAY_FIGURES_TAP,
        DayFiguresTap.class,
        "(accumulator_id, n_nulls, bad, label, c_1..c_n, x_1..x_m) - bad; adds the row's figures"
            + " to a DayFiguresAccumulator (see DayFiguresTap).",
        Extensions::dayFiguresTap);
    inject(
        extensions,
        SIGNED_LOG1P,
        Dense.class,
        "(x) - cast(signum(x) * log1p(abs(x)) as float) of a double x.",
        Extensions::signedLog1p);
    return BoxedUnit.UNIT;
  }

  private static void inject(
      SparkSessionExtensions extensions,
      String name,
      Class<?> implementation,
      String usage,
      Function1<Seq<Expression>, Expression> builder) {
    ExpressionInfo info = new ExpressionInfo(implementation.getName(), name, name + usage);
    extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(name), info, builder));
  }

  private static Object literal(Seq<Expression> args, int i) {
    if (args.size() <= i || !(args.apply(i) instanceof Literal)) {
      return null;
    }
    return ((Literal) args.apply(i)).value();
  }

  @SuppressWarnings("unchecked")
  private static Expression dayFiguresTap(Seq<Expression> args) {
    Object id = literal(args, 0);
    Object n = literal(args, 1);
    if (!(id instanceof Long || id instanceof Integer) || !(n instanceof Integer)) {
      throw new IllegalArgumentException(
          DAY_FIGURES_TAP + "(accumulator_id, n_nulls, bad, label, ...): accumulator_id must be"
              + " an integral literal and n_nulls an integer literal");
    }
    Option<AccumulatorV2<?, ?>> acc = AccumulatorContext.get(((Number) id).longValue());
    if (acc.isEmpty() || !(acc.get() instanceof DayFiguresAccumulator)) {
      throw new IllegalArgumentException(
          DAY_FIGURES_TAP + ": no DayFiguresAccumulator registered with id " + id);
    }
    return new DayFiguresTap(
        (DayFiguresAccumulator) acc.get(), (Integer) n, (Seq<Expression>) args.drop(2));
  }

  private static Expression signedLog1p(Seq<Expression> args) {
    // a non-double argument is cast to double by the analyzer (implicit input types)
    return staticCall(
        SIGNED_LOG1P, Dense.class, "signedLog1p", args, DataTypes.DoubleType, DataTypes.FloatType,
        false);
  }

  private static Expression trimWhitespace(Seq<Expression> args) {
    // a null id stays null (the caller fills it with "")
    return staticCall(
        TRIM_WHITESPACE, Ids.class, "trimWhitespace", args, null, DataTypes.StringType, true);
  }

  /**
   * A static call of {@code method(arg)} in the generated code (Spark's {@code StaticInvoke}),
   * null for a null argument.
   *
   * @param inputType the argument's type, which the analyzer casts to; null: taken as it is
   * @throws IllegalArgumentException not exactly one argument
   */
  @SuppressWarnings("unchecked")
  private static Expression staticCall(
      String name,
      Class<?> cls,
      String method,
      Seq<Expression> args,
      DataType inputType,
      DataType returnType,
      boolean returnNullable) {
    if (args.size() != 1) {
      throw new IllegalArgumentException(name + " takes one argument, got " + args.size());
    }
    scala.collection.immutable.List<Object> none = scala.collection.immutable.List$.MODULE$.empty();
    Seq<AbstractDataType> inputTypes =
        (Seq<AbstractDataType>) (Seq<?>) (inputType == null ? none : none.$colon$colon(inputType));
    return new StaticInvoke(
        cls, returnType, method, args, inputTypes, true, returnNullable, true, Option.empty());
  }
}

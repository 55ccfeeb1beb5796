package recpipe.spark;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.types.AbstractDataType;
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
    ExpressionInfo info =
        new ExpressionInfo(
            Ids.class.getName(),
            TRIM_WHITESPACE,
            TRIM_WHITESPACE + "(str) - str without ' ', tab, CR, LF and form feed at either end.");
    Function1<Seq<Expression>, Expression> builder = Extensions::trimWhitespace;
    extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(TRIM_WHITESPACE), info, builder));
    ExpressionInfo tap =
        new ExpressionInfo(
            DayFiguresTap.class.getName(),
            DAY_FIGURES_TAP,
            DAY_FIGURES_TAP + "(accumulator_id, n_nulls, bad, label, c_1..c_n, x_1..x_m) - bad;"
                + " adds the row's figures to a DayFiguresAccumulator (see DayFiguresTap).");
    Function1<Seq<Expression>, Expression> tapBuilder = Extensions::dayFiguresTap;
    extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(DAY_FIGURES_TAP), tap, tapBuilder));
    ExpressionInfo log1p =
        new ExpressionInfo(
            Dense.class.getName(),
            SIGNED_LOG1P,
            SIGNED_LOG1P + "(x) - cast(signum(x) * log1p(abs(x)) as float) of a double x.");
    Function1<Seq<Expression>, Expression> log1pBuilder = Extensions::signedLog1p;
    extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(SIGNED_LOG1P), log1p, log1pBuilder));
    return BoxedUnit.UNIT;
  }

  private static Object literal(Seq<Expression> args, int i) {
    return args.size() <= i || !(args.apply(i) instanceof Literal) ? null : ((Literal) args.apply(i)).value();
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

  @SuppressWarnings("unchecked")
  private static Expression signedLog1p(Seq<Expression> args) {
    if (args.size() != 1) {
      throw new IllegalArgumentException(SIGNED_LOG1P + " takes one double argument, got " + args.size());
    }
    // a non-double argument is cast to double by the analyzer (implicit input types)
    Seq<AbstractDataType> inputTypes =
        (Seq<AbstractDataType>)
            (Seq<?>) scala.collection.immutable.List$.MODULE$.empty().$colon$colon(DataTypes.DoubleType);
    return new StaticInvoke(
        Dense.class,
        DataTypes.FloatType,
        "signedLog1p",
        args,
        inputTypes,
        true, // propagateNull: null stays null
        false,
        true,
        Option.empty());
  }

  @SuppressWarnings("unchecked")
  private static Expression trimWhitespace(Seq<Expression> args) {
    if (args.size() != 1) {
      throw new IllegalArgumentException(
          TRIM_WHITESPACE + " takes one string argument, got " + args.size());
    }
    Seq<AbstractDataType> inputTypes =
        (Seq<AbstractDataType>) (Seq<?>) scala.collection.immutable.List$.MODULE$.empty();
    return new StaticInvoke(
        Ids.class,
        DataTypes.StringType,
        "trimWhitespace",
        args,
        inputTypes,
        true, // propagateNull: a null id stays null (the caller fills it with "")
        true,
        true,
        Option.empty());
  }
}

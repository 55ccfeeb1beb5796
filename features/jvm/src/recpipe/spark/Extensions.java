package recpipe.spark;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.DataTypes;
import scala.Function1;
import scala.Option;
import scala.Tuple3;
import scala.collection.immutable.Seq;
import scala.runtime.BoxedUnit;

/**
 * recpipe's SQL functions, registered by {@code spark.sql.extensions=recpipe.spark.Extensions}.
 *
 * <p>{@code recpipe_trim_whitespace(string)}: {@link Ids#trimWhitespace}, compiled into the
 * stage's generated code as a static call (Spark's {@code StaticInvoke}); null stays null.
 */
public final class Extensions implements Function1<SparkSessionExtensions, BoxedUnit> {
  /** The SQL name of {@link Ids#trimWhitespace}. */
  public static final String TRIM_WHITESPACE = "recpipe_trim_whitespace";

  /** The SQL name of {@link DayFigures}. */
  public static final String DAY_FIGURES = "recpipe_day_figures";

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    ExpressionInfo info =
        new ExpressionInfo(
            Ids.class.getName(),
            TRIM_WHITESPACE,
            TRIM_WHITESPACE + "(str) - str without ' ', tab, CR, LF and form feed at either end.");
    Function1<Seq<Expression>, Expression> builder = Extensions::trimWhitespace;
    extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(TRIM_WHITESPACE), info, builder));
    ExpressionInfo figures =
        new ExpressionInfo(
            DayFigures.class.getName(),
            DAY_FIGURES,
            DAY_FIGURES + "(n_nulls, bad, label, c_1..c_n, x_1..x_m) - a day's counts, nulls and"
                + " dense moments in one aggregate (see DayFigures).");
    Function1<Seq<Expression>, Expression> figuresBuilder = Extensions::dayFigures;
    extensions.injectFunction(new Tuple3<>(FunctionIdentifier.apply(DAY_FIGURES), figures, figuresBuilder));
    return BoxedUnit.UNIT;
  }

  @SuppressWarnings("unchecked")
  private static Expression dayFigures(Seq<Expression> args) {
    Object n = args.isEmpty() || !(args.head() instanceof Literal) ? null : ((Literal) args.head()).value();
    if (!(n instanceof Integer)) {
      throw new IllegalArgumentException(
          DAY_FIGURES + "(n_nulls, bad, label, ...): n_nulls must be an integer literal");
    }
    return new DayFigures((Integer) n, (Seq<Expression>) args.tail(), 0, 0);
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

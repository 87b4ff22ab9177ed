package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The plan of a snapshot read, asked of Python: the one implementation of the state machine
 * and of read planning is the Python source's ({@code persistshard.datasource.bridge plan}).
 *
 * <p>Asked of the driver's {@link PlanServer}. The answer names, per Spark partition, either the part slices to decode here (local
 * part files and inline parts, every chunk's diffs proven to be 1 by its statistics, every
 * time at or before the snapshot, every column stored with the type Spark reads) or the
 * Python source's own partition (pickled), which {@link PythonReader} has Python read and
 * hand over as Arrow batches. The read's option checks and errors are Python's.
 */
final class Planner {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** A planned read: its partitions and the size and rows Spark's optimizer sees. */
  static final class Plan {
    final InputPartition[] partitions;
    final long sizeInBytes;
    final long numRows;

    Plan(InputPartition[] partitions, long sizeInBytes, long numRows) {
      this.partitions = partitions;
      this.sizeInBytes = sizeInBytes;
      this.numRows = numRows;
    }
  }

  private Planner() {}

  static String python() {
    return PythonProcess.python();
  }

  /** The read request of {@code options} and the schemas, as the bridge takes it. */
  static ObjectNode request(CaseInsensitiveStringMap options, StructType schema,
      StructType required) {
    ObjectNode req = JSON.createObjectNode();
    ObjectNode opts = req.putObject("options");
    options.asCaseSensitiveMap().forEach(opts::put);
    try {
      req.set("schema", JSON.readTree(schema.json()));
      req.set("required", JSON.readTree(required.json()));
    } catch (IOException e) {
      throw new IllegalStateException("Spark's schema JSON does not parse", e);
    }
    return req;
  }

  static Plan plan(CaseInsensitiveStringMap options, StructType schema, StructType required,
      String filter) {
    ObjectNode req = request(options, schema, required);
    JsonNode plan = PlanServer.plan(python(), req.toString());
    List<InputPartition> out = new ArrayList<>();
    for (JsonNode p : plan.get("partitions")) {
      if (p.has("native")) {
        List<NativePartition.Slice> slices = new ArrayList<>();
        for (JsonNode s : p.get("native")) {
          int[] chunks = null;
          if (s.hasNonNull("chunks")) {
            chunks = new int[s.get("chunks").size()];
            for (int i = 0; i < chunks.length; i++) {
              chunks[i] = s.get("chunks").get(i).intValue();
            }
          }
          byte[] inline = s.hasNonNull("inline")
              ? Base64.getDecoder().decode(s.get("inline").textValue()) : null;
          String path = s.hasNonNull("path") ? s.get("path").textValue() : null;
          slices.add(new NativePartition.Slice(s.get("key").textValue(), path, inline, chunks));
        }
        List<String> columns = new ArrayList<>();
        p.get("columns").forEach(c -> columns.add(c.textValue()));
        out.add(new NativePartition(slices, columns, filter));
      } else {
        ObjectNode read = JSON.createObjectNode();
        read.set("options", req.get("options"));
        read.set("required", req.get("required"));
        read.put("partition", p.get("python").textValue());
        out.add(new PythonPartition(read.toString()));
      }
    }
    return new Plan(out.toArray(new InputPartition[0]), plan.get("size_bytes").longValue(),
        plan.get("num_rows").longValue());
  }
}

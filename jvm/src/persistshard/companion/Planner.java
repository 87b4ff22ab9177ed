package persistshard.companion;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.util.SerializableConfiguration;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The plan of a snapshot read, asked of Python: the one implementation of the state machine
 * and of read planning is the Python source's (a plan request of {@code
 * persistshard.datasource.bridge serve}).
 *
 * <p>Asked of the driver's {@link PlanServer}. The answer names, per Spark partition, either the part slices to decode here (local
 * part files, inline parts, and parts at Hadoop URLs whose scheme this session has a file
 * system for, {@link #hadoopSchemes}; every chunk's diffs proven to be 1 by its statistics, every
 * time at or before the snapshot, every column stored with the type Spark reads) or the
 * Python source's own partition (pickled), which {@link PythonReader} has Python read and
 * hand over as Arrow batches. The read's option checks and errors are Python's.
 */
final class Planner {
  private static final ObjectMapper JSON = new ObjectMapper();

  private static final Logger LOG = LoggerFactory.getLogger(Planner.class);
  /**
   * The Hadoop schemes a plan may name parts by: those of the Python side's
   * {@code HADOOP_SCHEMES} ({@code persistshard.core.storage.blob}). A scheme missing here
   * only sends its parts to Python.
   */
  static final List<String> HADOOP_SCHEMES = List.of("s3a", "gs", "hdfs");

  /**
   * A planned read: its partitions, the size and rows Spark's optimizer sees, and the
   * session's Hadoop configuration broadcast for the executors when a partition reads a part
   * through Hadoop's file systems (else null).
   */
  static final class Plan {
    final InputPartition[] partitions;
    final long sizeInBytes;
    final long numRows;
    final Broadcast<SerializableConfiguration> hadoopConf;

    Plan(InputPartition[] partitions, long sizeInBytes, long numRows,
        Broadcast<SerializableConfiguration> hadoopConf) {
      this.partitions = partitions;
      this.sizeInBytes = sizeInBytes;
      this.numRows = numRows;
      this.hadoopConf = hadoopConf;
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

  /**
   * The schemes of {@link #HADOOP_SCHEMES} that {@code conf} has a file system class for
   * ({@link FileSystem#getFileSystemClass}, which throws when there is none, or when the
   * class it names is not on the classpath: {@code s3a} without hadoop-aws). Decided on the
   * driver for each scan; the parts of the others are read through Python.
   */
  static List<String> hadoopSchemes(Configuration conf) {
    List<String> out = new ArrayList<>();
    for (String scheme : HADOOP_SCHEMES) {
      try {
        FileSystem.getFileSystemClass(scheme, conf);
        out.add(scheme);
      } catch (IOException | RuntimeException | LinkageError e) {
        LOG.debug("persistshard: no Hadoop file system for {}:// in this session ({}); parts "
            + "there are read through Python", scheme, e.toString());
      }
    }
    return out;
  }

  static Plan plan(CaseInsensitiveStringMap options, StructType schema, StructType required,
      String filter) {
    ObjectNode req = request(options, schema, required);
    SparkSession session = SparkSession.active();
    Configuration conf = session.sessionState().newHadoopConf();
    ArrayNode schemes = req.putArray("hadoop_schemes");
    hadoopSchemes(conf).forEach(schemes::add);
    JsonNode plan = PlanServer.plan(python(), req);
    boolean hadoop = false;
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
          String url = s.hasNonNull("url") ? s.get("url").textValue() : null;
          hadoop |= url != null;
          slices.add(
              new NativePartition.Slice(s.get("key").textValue(), path, url, inline, chunks));
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
    Broadcast<SerializableConfiguration> shipped = hadoop
        ? SerializableConfiguration.broadcast(session.sparkContext(), conf) : null;
    return new Plan(out.toArray(new InputPartition[0]), plan.get("size_bytes").longValue(),
        plan.get("num_rows").longValue(), shipped);
  }
}
